package e2e

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
)

// TestKubeletAPI: the lab's kubelet serves the kubelet API as a kubelet
// does, so kubectl works on its pods through the real API server:
// `kubectl exec` enters the container as it runs (its capabilities, no
// /run/shunt of the node, the exit code passed back), `kubectl logs`
// returns what the container wrote (--tail, --timestamps, --since too),
// its environment has the kubernetes Service's variables, and `kubectl
// port-forward` reaches a port of the pod.
func TestKubeletAPI(t *testing.T) {
	k := newKubeNode(t)
	k.runPod("default", "web", nil, "sh", "-c",
		`grep -E "^Cap(Eff|Bnd)" /proc/self/status; echo first line; echo hello from the container; exec shunt lab serve --http 8080`)
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := k.kubectl(nil, args...)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	var logs string
	waitFor(t, 10*time.Second, "the container's output in kubectl logs", func() bool {
		out, err := k.kubectl(nil, "logs", "web")
		logs = string(out)
		return err == nil && strings.Contains(logs, "hello from the container") && strings.Contains(logs, "serving http")
	})
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	if out := kubectl("logs", "web", "--tail=2"); out != strings.Join(lines[len(lines)-2:], "\n")+"\n" {
		t.Errorf("kubectl logs --tail=2: %q, want the last two lines of\n%s", out, logs)
	}

	// The log records when each line was written (the CRI's format).
	stamped := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z hello from the container$`)
	if out := kubectl("logs", "web", "--timestamps", "--since=1h"); !slices.ContainsFunc(strings.Split(out, "\n"), stamped.MatchString) {
		t.Errorf("kubectl logs --timestamps --since=1h: no line %s in\n%s", stamped, out)
	}
	if out := kubectl("logs", "web", "--since-time=2100-01-01T00:00:00Z"); out != "" {
		t.Errorf("kubectl logs --since-time in the future: %q, want nothing", out)
	}
	// The pod's environment has the API server's Service, as kubelet
	// gives it, and the Node the machine's system information.
	svcIP := kubectl("get", "service", "kubernetes", "-o", "jsonpath={.spec.clusterIP}")
	if out := kubectl("exec", "web", "--", "sh", "-c", `echo "$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT $KUBERNETES_PORT"`); out != svcIP+":443 tcp://"+svcIP+":443\n" {
		t.Errorf("the pod's KUBERNETES_* variables: %q, want the kubernetes Service's %s:443", out, svcIP)
	}
	if out := kubectl("get", "nodes", "-o", "jsonpath={.items[0].status.nodeInfo.kernelVersion}/{.items[0].status.nodeInfo.osImage}/{.items[0].status.allocatable.memory}"); strings.Contains(out, "//") || strings.HasSuffix(out, "/") {
		t.Errorf("the Node's nodeInfo and allocatable: %q, want kernel, OS image and memory", out)
	}

	checkPreviousLog(t, k)
	checkMountPointsRemoved(t, k)
	checkKubeletAuthz(t, k)

	capLines := regexp.MustCompile(`(?m)^Cap(Eff|Bnd):\s+[0-9a-f]+$`)
	own := capLines.FindAllString(logs, -1)
	execd := capLines.FindAllString(kubectl("exec", "web", "--", "cat", "/proc/self/status"), -1)
	if len(own) != 2 || strings.Join(own, ",") != strings.Join(execd, ",") || !strings.Contains(own[0], "00000000a80425fb") {
		t.Errorf("kubectl exec's capabilities %q, the container's own %q: want the runtime's default set in both", execd, own)
	}
	if out, err := k.kubectl(nil, "exec", "web", "--", "sh", "-c", "ls -A /run/shunt"); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("kubectl exec sees the node's /run/shunt (%v):\n%s", err, out)
	}
	cmd := exec.Command(k.kube.Kubectl(), "--kubeconfig", k.kube.Kubeconfig, "exec", "web", "--", "sh", "-c", "exit 3")
	if err := cmd.Run(); cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 3 {
		t.Errorf("kubectl exec of a command that exits 3: %v, want exit code 3", err)
	}
	if out, err := k.kubectl([]byte("from stdin\n"), "exec", "-i", "web", "--", "cat"); err != nil || string(out) != "from stdin\n" {
		t.Errorf("kubectl exec -i: %q, %v", out, err)
	}

	checkExecWithTerminal(t, k)
	checkAttach(t, k)

	// Port-forward from this host to the pod's port 8080.
	pf := exec.Command(k.kube.Kubectl(), "--kubeconfig", k.kube.Kubeconfig, "port-forward", "pod/web", ":8080")
	stdout, err := pf.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	pf.Stderr = &stderr
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pf.Process.Kill(); pf.Wait() })
	local := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		re := regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 8080`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				local <- m[1]
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	select {
	case port := <-local:
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(fmt.Sprintf("http://127.0.0.1:%s/", port))
		if err != nil {
			t.Fatalf("GET through kubectl port-forward: %v\nkubectl: %s", err, stderr.String())
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "web") {
			t.Errorf("GET through kubectl port-forward: %s %q, want 200 from pod web", resp.Status, body)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("kubectl port-forward never listened:\n%s", stderr.String())
	}
}

// checkPreviousLog: after a restart, kubectl logs shows the running
// instance's output and --previous the one before's.
func checkPreviousLog(t *testing.T, k *kubeNode) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "crash", Namespace: "default"}, Spec: corev1.PodSpec{NodeName: k.node,
		Containers: []corev1.Container{{Name: "c", Image: "lab", Command: []string{"sh", "-c", "echo instance $(cat /proc/sys/kernel/random/uuid); sleep 1; exit 1"}}}}}
	if _, err := k.cs.CoreV1().Pods("default").Create(k.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "pod crash restarted", func() bool {
		p, err := k.cs.CoreV1().Pods("default").Get(k.ctx, "crash", metav1.GetOptions{})
		return err == nil && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1
	})
	cur, errCur := k.kubectl(nil, "logs", "crash")
	prev, errPrev := k.kubectl(nil, "logs", "crash", "--previous")
	if errCur != nil || errPrev != nil || !strings.HasPrefix(string(cur), "instance ") || !strings.HasPrefix(string(prev), "instance ") || string(cur) == string(prev) {
		t.Errorf("kubectl logs: %q (%v), --previous: %q (%v); want each instance's own line", cur, errCur, prev, errPrev)
	}
}

// checkMountPointsRemoved: a volume mounted where the node has nothing
// (the container sees the node's file system) gets a mount point made for
// it, which goes with the pod: the lab leaves nothing on the machine.
func checkMountPointsRemoved(t *testing.T, k *kubeNode) {
	t.Helper()
	top := fmt.Sprintf("/shunt-e2e-%d", time.Now().UnixNano())
	target := top + "/data"
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "mounts", Namespace: "default"}, Spec: corev1.PodSpec{NodeName: k.node,
		Volumes: []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		Containers: []corev1.Container{{Name: "c", Image: "lab", Command: []string{"sh", "-c", "echo x > " + target + "/f; sleep infinity"},
			VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: target}}}}}}
	t.Cleanup(func() { os.Remove(target); os.Remove(top) })
	if _, err := k.cs.CoreV1().Pods("default").Create(k.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "pod mounts running", func() bool {
		p, err := k.cs.CoreV1().Pods("default").Get(k.ctx, "mounts", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
	if st, err := os.Stat(target); err != nil || !st.IsDir() {
		t.Errorf("the mount point %s on the node: %v", target, err)
	}
	if _, err := os.Stat(target + "/f"); err == nil {
		t.Errorf("the container's file is on the node's %s, not in its volume", target)
	}
	if err := k.cs.CoreV1().Pods("default").Delete(k.ctx, "mounts", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the mount point "+top+" gone with the pod", func() bool {
		_, err := os.Lstat(top)
		return errors.Is(err, os.ErrNotExist)
	})
}

// checkKubeletAuthz: the kubelet API serves a client the cluster's CA
// vouches for only when the API server authorizes it (a
// SubjectAccessReview of nodes/proxy, as kubelet's webhook mode): a user
// without RBAC is refused, one granted nodes/proxy is served.
func checkKubeletAuthz(t *testing.T, k *kubeNode) {
	t.Helper()
	node, err := k.cs.CoreV1().Nodes().Get(k.ctx, k.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var addr string
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			addr = a.Address
		}
	}
	url := fmt.Sprintf("https://%s/containerLogs/default/web/c?tailLines=1", net.JoinHostPort(addr, fmt.Sprint(node.Status.DaemonEndpoints.KubeletEndpoint.Port)))
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "kubelet-api-carol"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/proxy"}, Verbs: []string{"get"}}}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "kubelet-api-carol"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "carol"}}}
	if _, err := k.cs.RbacV1().ClusterRoles().Create(k.ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.cs.RbacV1().ClusterRoleBindings().Create(k.ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Its serving certificate is the cluster CA's (a CSR of signer
	// kubernetes.io/kubelet-serving, signed by kube-controller-manager),
	// for the node's name and address.
	caPEM, err := os.ReadFile(filepath.Join(k.kube.Dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	var verifyErr error
	signed := func() bool {
		conn, err := tls.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "https://"), "/containerLogs/default/web/c?tailLines=1"),
			&tls.Config{RootCAs: roots, ServerName: addr})
		if verifyErr = err; err != nil {
			return false
		}
		leaf := conn.ConnectionState().PeerCertificates[0]
		conn.Close()
		if leaf.Subject.CommonName != "system:node:"+k.node || !slices.Contains(leaf.DNSNames, k.node) {
			verifyErr = fmt.Errorf("subject %s, DNS names %v", leaf.Subject, leaf.DNSNames)
			return false
		}
		return true
	}
	for deadline := time.Now().Add(30 * time.Second); !signed() && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
	}
	if verifyErr != nil {
		t.Errorf("the kubelet API's certificate, 30 s after: %v", verifyErr)
	}
	for user, want := range map[string]int{"alice": http.StatusForbidden, "carol": http.StatusOK} {
		resp, err := clusterClient(t, k.kube.Dir, user).Get(url)
		if err != nil {
			t.Fatalf("%s: GET %s: %v", user, url, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s on the kubelet API: %s %q, want %d", user, resp.Status, body, want)
		}
	}
}

// clusterClient is an HTTPS client with a certificate of the cluster's CA
// (ca.crt, ca.key in its directory) for user.
func clusterClient(t *testing.T, dir, user string) *http.Client {
	t.Helper()
	caPEM, err1 := os.ReadFile(filepath.Join(dir, "ca.crt"))
	keyPEM, err2 := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	ca, err := tls.X509KeyPair(caPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(ca.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: user},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), ca.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true, // the kubelet's serving certificate is its own
		Certificates:       []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
	}}}
}

// checkExecWithTerminal: an exec with a terminal (kubectl exec -it) runs
// the command on a terminal of the client's size, through the API server,
// over WebSocket as kubectl does.
func checkExecWithTerminal(t *testing.T, k *kubeNode) {
	t.Helper()
	req := k.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name("web").SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Command: []string{"sh", "-c", `while [ "$(stty size)" = "0 0" ]; do sleep 0.1; done; tty; stty size`}, Stdin: true, Stdout: true, TTY: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewWebSocketExecutor(k.kube.RESTConfig(), "GET", req.URL().String())
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sizes := fixedSize{remotecommand.TerminalSize{Width: 100, Height: 40}}
	ctx, cancel := context.WithTimeout(k.ctx, 20*time.Second)
	defer cancel()
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: strings.NewReader(""), Stdout: &out, Tty: true, TerminalSizeQueue: &sizes})
	if err != nil || !regexp.MustCompile(`(?m)^/dev/pts/\d+\r?$`).MatchString(out.String()) || !strings.Contains(out.String(), "40 100") {
		t.Errorf("exec with a terminal of 100x40: %v:\n%q", err, out.String())
	}
}

// checkAttach: kubectl attach streams what a running container writes
// from then on.
func checkAttach(t *testing.T, k *kubeNode) {
	t.Helper()
	k.runPod("default", "ticker", nil, "sh", "-c", `i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done`)
	attach := exec.Command(k.kube.Kubectl(), "--kubeconfig", k.kube.Kubeconfig, "attach", "ticker")
	stdout, err := attach.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	attach.Stderr = &stderr
	if err := attach.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { attach.Process.Kill(); attach.Wait() }()
	ticks := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "tick ") {
				ticks <- sc.Text()
			}
		}
		close(ticks)
	}()
	var got []string
	timeout := time.After(15 * time.Second)
	for len(got) < 3 {
		select {
		case tick, ok := <-ticks:
			if !ok {
				t.Fatalf("kubectl attach ended after %q:\n%s", got, stderr.String())
			}
			got = append(got, tick)
		case <-timeout:
			t.Fatalf("kubectl attach: %q in 15 s, want 3 ticks:\n%s", got, stderr.String())
		}
	}
	var first, last int
	fmt.Sscanf(got[0], "tick %d", &first)
	fmt.Sscanf(got[2], "tick %d", &last)
	if last != first+2 {
		t.Errorf("kubectl attach: %q, want consecutive ticks", got)
	}
}

// fixedSize is a terminal that has one size.
type fixedSize []remotecommand.TerminalSize

func (f *fixedSize) Next() *remotecommand.TerminalSize {
	if len(*f) == 0 {
		return nil
	}
	s := (*f)[0]
	*f = (*f)[1:]
	return &s
}
