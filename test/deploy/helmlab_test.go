package deploy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/kubecluster"
	"github.com/shuntnet/shunt/internal/kubetest"
)

// TestHelmInstallOnLabNodes installs shunt the way users do: a control
// plane (kube-apiserver, controllers with the DaemonSet's, kube-scheduler),
// two lab nodes that are kubelets only (`shuntd kubelet`, each in a network
// namespace on an underlay bridge), and `helm install` of deploy/helm/shunt
// through the Helm Go module (tools/helm install) with the image `make
// image` wrote (bin/image/oci): each node's kubelet runs the chart's
// DaemonSet pod from that image, its init container installs the CNI, and
// the agent networks the pods. Then pods on the two nodes reach each other
// and a ClusterIP; `helm uninstall` leaves nothing of the agents on the
// nodes (pins, run and state directories, interfaces, CNI configuration).
func TestHelmInstallOnLabNodes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, mounts, BPF")
	}
	bin, _ := filepath.Abs("../../bin")
	layout := filepath.Join(bin, "image", "oci")
	if _, err := os.Stat(filepath.Join(layout, "index.json")); err != nil {
		t.Skipf("no image layout at %s: run `make build image` first (%v)", layout, err)
	}
	imageRef := layoutImageName(t, layout)
	// The image of "another build" for helm upgrade: the same layers, a
	// configuration with one more label, hence another digest and tag.
	upgradeLayout, upgradeRef := relabeledLayout(t, layout, imageRef)
	c := kubetest.StartWith(t, kubecluster.Options{NodeLifecycle: true, Scheduler: true, WorkloadControllers: true,
		ServiceCIDR: "10.199.0.0/16", ClusterCIDR: fmt.Sprintf("10.%d.0.0/16", 150+rand.IntN(48))})
	helm := buildHelmTool(t)
	id := fmt.Sprintf("%04d", rand.IntN(10000))
	nodes := buildUnderlay(t, "hl"+id, 2)
	for _, nd := range nodes {
		relay, err := c.RelayInto("/run/netns/" + nd.netns)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { relay.Close() })
		startNodeKubelet(t, bin, c.Kubeconfig, []string{layout, upgradeLayout}, nd)
	}
	u, err := url.Parse(c.Server)
	if err != nil {
		t.Fatal(err)
	}
	apiHost, apiPort, _ := strings.Cut(u.Host, ":")
	repo, tag, _ := strings.Cut(imageRef, ":")
	values := []string{
		"image.repository=" + repo, "image.tag=" + tag,
		// The nodes reach the API server through their relay, on their
		// loopback: no Service routing is needed before the agent runs.
		"k8sServiceHost=" + apiHost, "k8sServicePort=" + apiPort,
		"clusterCIDR=" + c.ClusterCIDR, "serviceCIDR=" + c.ServiceCIDR,
		// Lab nodes share one machine's /run/shunt, bpffs and cgroups:
		// each node's agent is an instance of its own, named after it.
		"extraEnv[0].name=SHUNT_INSTANCE", "extraEnv[0].valueFrom.fieldRef.fieldPath=spec.nodeName",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	start := time.Now()
	runHelm(t, helm, "install", c.Kubeconfig, values...)
	t.Cleanup(func() {
		exec.Command(helm, "uninstall", "-kubeconfig", c.Kubeconfig, "-namespace", "shunt-system", "shunt").Run()
	})
	t.Cleanup(func() {
		// Before helm uninstall (a later cleanup, run first) removes them.
		if t.Failed() {
			for _, nd := range nodes {
				logs, _ := filepath.Glob(filepath.Join(nd.kubeletInstance().StateDir(), "pods", "*", "*.log"))
				for _, l := range logs {
					b, _ := os.ReadFile(l)
					t.Logf("container log %s:\n%s", l, tailString(string(b), 3000))
				}
			}
		}
	})
	waitAgentsReady(t, ctx, c, len(nodes), 90*time.Second)
	installToReady := time.Since(start)
	t.Logf("helm install -> every node's agent Ready and every Node Ready: %s", installToReady.Round(100*time.Millisecond))
	if installToReady > 60*time.Second {
		t.Errorf("install to Ready took %s, the target is 60 s", installToReady.Round(time.Second))
	}

	// Two pods on the two nodes, a Service in front of the server.
	cs := c.Client
	ns := "hl" + id
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	server := labPod(ns, "server", nodes[0].name, []string{"python3", "-m", "http.server", "8080", "--bind", "0.0.0.0"})
	server.Labels = map[string]string{"app": "server"}
	client := labPod(ns, "client", nodes[1].name, []string{"sleep", "3600"})
	for _, p := range []*corev1.Pod{server, client} {
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "server"}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "server"},
		Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	serverIP := waitPodRunning(t, ctx, c, ns, "server")
	waitPodRunning(t, ctx, c, ns, "client")
	clientNetns := "/run/netns/" + nodes[1].kubeletInstance().PodNetns(ns, "client")
	for _, target := range []string{serverIP + ":8080", svc.Spec.ClusterIP + ":80"} {
		if out, err := retryCurl(clientNetns, "http://"+target+"/", 30*time.Second); err != nil {
			t.Errorf("client on %s -> %s (server on %s): %v\n%s", nodes[1].name, target, nodes[0].name, err, out)
		} else {
			t.Logf("client on %s reached %s", nodes[1].name, target)
		}
	}

	// helm upgrade to the other image while the client opens a connection
	// to the ClusterIP every 50 ms: the agents are replaced one node at a
	// time (RollingUpdate), the datapath stays pinned meanwhile.
	load := exec.Command("nsenter", "--net="+clientNetns, "sh", "-c",
		`while :; do if curl -s -m 1 -o /dev/null http://`+svc.Spec.ClusterIP+`:80/; then echo ok; else echo fail; fi; sleep 0.05; done`)
	var loadOut strings.Builder
	load.Stdout = &loadOut
	if err := load.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	upRepo, upTag, _ := strings.Cut(upgradeRef, ":")
	start = time.Now()
	runHelm(t, helm, "upgrade", c.Kubeconfig, append(slices.Clone(values), "image.repository="+upRepo, "image.tag="+upTag)...)
	waitAgentsOf(t, ctx, c, upgradeRef, len(nodes), 2*time.Minute)
	t.Logf("helm upgrade -> every agent Ready from %s: %s", upgradeRef, time.Since(start).Round(100*time.Millisecond))
	time.Sleep(time.Second)
	load.Process.Kill()
	load.Wait()
	ok, failed := strings.Count(loadOut.String(), "ok\n"), strings.Count(loadOut.String(), "fail\n")
	t.Logf("connections to the ClusterIP during the upgrade: %d succeeded, %d failed", ok, failed)
	if failed > 0 || ok == 0 {
		t.Errorf("during helm upgrade %d connections to the ClusterIP failed (%d succeeded): want none", failed, ok)
	}

	// Uninstall: the test's pods first (a CNI leaves pods it networked
	// to their runtime), then the release.
	if err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitNoPods(t, ctx, c, ns, time.Minute)
	start = time.Now()
	runHelm(t, helm, "uninstall", c.Kubeconfig)
	waitNoPods(t, ctx, c, "shunt-system", 90*time.Second)
	t.Logf("helm uninstall -> no agent pod left: %s", time.Since(start).Round(100*time.Millisecond))
	for _, nd := range nodes {
		for _, left := range nodeLeftovers(nd) {
			t.Errorf("node %s after helm uninstall: %s", nd.name, left)
		}
	}
}

// relabeledLayout writes a copy of the layout's image with one more label
// in its configuration: another manifest digest, tagged "upgrade".
func relabeledLayout(t *testing.T, layout, ref string) (string, string) {
	readJSON := func(p string, v any) {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, v); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	var index map[string]any
	readJSON(filepath.Join(layout, "index.json"), &index)
	desc := index["manifests"].([]any)[0].(map[string]any)
	blob := func(d string) string {
		return filepath.Join(layout, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))
	}
	var manifest map[string]any
	readJSON(blob(desc["digest"].(string)), &manifest)
	var config map[string]any
	readJSON(blob(manifest["config"].(map[string]any)["digest"].(string)), &config)
	config["config"].(map[string]any)["Labels"].(map[string]any)["org.opencontainers.image.version"] = "upgrade"

	out := filepath.Join(t.TempDir(), "oci-upgrade")
	if err := os.MkdirAll(filepath.Join(out, "blobs", "sha256"), 0o755); err != nil {
		t.Fatal(err)
	}
	put := func(v any) (string, int) {
		data, _ := json.Marshal(v)
		sum := sha256.Sum256(data)
		d := "sha256:" + hex.EncodeToString(sum[:])
		if err := os.WriteFile(filepath.Join(out, "blobs", "sha256", hex.EncodeToString(sum[:])), data, 0o644); err != nil {
			t.Fatal(err)
		}
		return d, len(data)
	}
	for _, l := range manifest["layers"].([]any) {
		d := l.(map[string]any)["digest"].(string)
		data, err := os.ReadFile(blob(d))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, "blobs", "sha256", strings.TrimPrefix(d, "sha256:")), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cd, cn := put(config)
	manifest["config"].(map[string]any)["digest"], manifest["config"].(map[string]any)["size"] = cd, cn
	md, mn := put(manifest)
	repo, _, _ := strings.Cut(ref, ":")
	newRef := repo + ":upgrade"
	desc["digest"], desc["size"] = md, mn
	desc["annotations"] = map[string]any{"org.opencontainers.image.ref.name": "upgrade", "io.containerd.image.name": newRef}
	data, _ := json.Marshal(index)
	if err := os.WriteFile(filepath.Join(out, "index.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return out, newRef
}

// waitAgentsOf waits until n agents of image are Ready.
func waitAgentsOf(t *testing.T, ctx context.Context, c *kubetest.Cluster, image string, n int, within time.Duration) {
	deadline := time.Now().Add(within)
	for {
		pods, err := c.Client.CoreV1().Pods("shunt-system").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ready := 0
		var why []string
		for _, p := range pods.Items {
			if p.Spec.Containers[0].Image == image && podReady(&p) && p.DeletionTimestamp == nil {
				ready++
			} else {
				why = append(why, fmt.Sprintf("%s (%s) on %s: %s %s", p.Name, p.Spec.Containers[0].Image, p.Spec.NodeName, p.Status.Phase, containerWaits(&p)))
			}
		}
		if ready == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d agents of %s ready after %s: %s", ready, n, image, within, strings.Join(why, "; "))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

type helmLabNode struct {
	name, netns, addr string
}

func (nd helmLabNode) kubeletInstance() instance.Instance {
	return instance.Instance{Name: nd.name + "k"}
}

// layoutImageName is the image name the layout's index carries.
func layoutImageName(t *testing.T, layout string) string {
	data, err := os.ReadFile(filepath.Join(layout, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var index struct {
		Manifests []struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(data, &index); err != nil || len(index.Manifests) == 0 {
		t.Fatalf("%s/index.json: %v (%d manifests)", layout, err, len(index.Manifests))
	}
	name := index.Manifests[0].Annotations["io.containerd.image.name"]
	if name == "" {
		t.Fatalf("%s/index.json: no io.containerd.image.name", layout)
	}
	return name
}

// buildHelmTool builds tools/helm (a module of its own) once for the test.
func buildHelmTool(t *testing.T) string {
	out := filepath.Join(t.TempDir(), "helm")
	cmd := exec.Command("go", "build", "-o", out, ".")
	cmd.Dir = "../../tools/helm"
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building tools/helm: %v\n%s", err, b)
	}
	return out
}

func runHelm(t *testing.T, helm, verb, kubeconfig string, sets ...string) {
	t.Helper()
	args := []string{verb, "-kubeconfig", kubeconfig, "-namespace", "shunt-system"}
	for _, s := range sets {
		args = append(args, "-set", s)
	}
	if verb == "uninstall" {
		args = append(args, "-wait", "60s", "shunt")
	} else {
		args = append(args, "../../deploy/helm/shunt")
	}
	out, err := exec.Command(helm, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("tools/helm %s: %v\n%s", verb, err, out)
	}
	t.Logf("tools/helm %s: %s", verb, strings.TrimSpace(string(out)))
}

// buildUnderlay makes a bridge in a namespace of its own and n node
// namespaces on it at .1, .2, ... of a random 172.31.X.0/24.
func buildUnderlay(t *testing.T, prefix string, n int) []helmLabNode {
	subnet := fmt.Sprintf("172.31.%d.", 100+rand.IntN(150))
	underlay := prefix + "u"
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", underlay)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", underlay).Run() })
	ip("-n", underlay, "link", "add", "br0", "type", "bridge")
	ip("-n", underlay, "link", "set", "br0", "up")
	var nodes []helmLabNode
	for i := range n {
		nd := helmLabNode{name: fmt.Sprintf("%s%c", prefix, 'a'+i), netns: fmt.Sprintf("%sn%d", prefix, i+1), addr: subnet + strconv.Itoa(i+1)}
		ip("netns", "add", nd.netns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", nd.netns).Run() })
		leg := fmt.Sprintf("n%d", i+1)
		ip("-n", nd.netns, "link", "set", "lo", "up")
		ip("-n", nd.netns, "link", "add", "ul0", "type", "veth", "peer", "name", leg, "netns", underlay)
		ip("-n", nd.netns, "addr", "add", nd.addr+"/24", "dev", "ul0")
		ip("-n", nd.netns, "link", "set", "ul0", "up")
		ip("-n", underlay, "link", "set", leg, "master", "br0", "up")
		nodes = append(nodes, nd)
	}
	return nodes
}

// startNodeKubelet runs `shuntd kubelet` in the node's namespace; at the
// end it stops it and removes what it made.
func startNodeKubelet(t *testing.T, bin, kubeconfig string, layouts []string, nd helmLabNode) {
	logPath := filepath.Join(t.TempDir(), nd.name+"-kubelet.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--net=/run/netns/" + nd.netns, filepath.Join(bin, "shuntd"), "kubelet",
		"--kubeconfig", kubeconfig, "--node-name", nd.name, "--node-addr", nd.addr}
	for _, l := range layouts {
		args = append(args, "--image-dir", l)
	}
	cmd := exec.Command("nsenter", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logf.Close()
		if out, err := exec.Command(filepath.Join(bin, "shuntd"), "kubelet", "--remove", "--node-name", nd.name).CombinedOutput(); err != nil {
			t.Errorf("removing node %s: %v\n%s", nd.name, err, out)
		}
		// The agent's instance, should the test have stopped before
		// helm uninstall removed it.
		exec.Command("nsenter", "--net=/run/netns/"+nd.netns, filepath.Join(bin, "shunt"), "--instance", nd.name, "uninstall").Run()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("kubelet of %s:\n%s", nd.name, tailString(string(b), 6000))
		}
	})
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// waitAgentsReady waits until the DaemonSet has a Ready agent on each of n
// nodes and every Node is Ready.
func waitAgentsReady(t *testing.T, ctx context.Context, c *kubetest.Cluster, n int, within time.Duration) {
	deadline := time.Now().Add(within)
	for {
		var why []string
		pods, err := c.Client.CoreV1().Pods("shunt-system").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ready := 0
		for _, p := range pods.Items {
			if podReady(&p) {
				ready++
			} else {
				why = append(why, fmt.Sprintf("pod %s on %s: %s %s", p.Name, p.Spec.NodeName, p.Status.Phase, containerWaits(&p)))
			}
		}
		if ready < n {
			why = append(why, fmt.Sprintf("%d of %d agents ready", ready, n))
		}
		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, nd := range nodes.Items {
			for _, cond := range nd.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status != corev1.ConditionTrue {
					why = append(why, fmt.Sprintf("node %s: %s %s", nd.Name, cond.Reason, cond.Message))
				}
			}
		}
		if len(why) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, strings.Join(why, "; "))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func containerWaits(p *corev1.Pod) string {
	var s []string
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			s = append(s, cs.Name+" waiting "+w.Reason+" "+w.Message)
		}
		if cs.State.Terminated != nil {
			s = append(s, fmt.Sprintf("%s exited %d", cs.Name, cs.State.Terminated.ExitCode))
		}
	}
	return strings.Join(s, ", ")
}

// labPod is a pod of the lab image: the node's programs, on the node named.
func labPod(ns, name, node string, command []string) *corev1.Pod {
	zero := int64(0)
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{
		NodeName: node, TerminationGracePeriodSeconds: &zero,
		Containers: []corev1.Container{{Name: "c", Image: "lab", Command: command}},
	}}
}

func waitPodRunning(t *testing.T, ctx context.Context, c *kubetest.Cluster, ns, name string) string {
	deadline := time.Now().Add(60 * time.Second)
	for {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			return p.Status.PodIP
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s not running after 60 s: %s %s", ns, name, p.Status.Phase, containerWaits(p))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func waitNoPods(t *testing.T, ctx context.Context, c *kubetest.Cluster, ns string, within time.Duration) {
	deadline := time.Now().Add(within)
	for {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pods left in %s after %s (first %s)", len(pods.Items), ns, within, pods.Items[0].Name)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func retryCurl(netnsPath, url string, within time.Duration) (string, error) {
	deadline := time.Now().Add(within)
	for {
		out, err := exec.Command("nsenter", "--net="+netnsPath, "curl", "-sS", "-m", "2", "-o", "/dev/null", "-w", "%{http_code}", url).CombinedOutput()
		if err == nil && string(out) == "200" {
			return string(out), nil
		}
		if time.Now().After(deadline) {
			return string(out), fmt.Errorf("curl %s: %v", url, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// nodeLeftovers is what of the node's agent (instance named after the
// node) is still on the machine.
func nodeLeftovers(nd helmLabNode) []string {
	agent := instance.Instance{Name: nd.name}
	var left []string
	for _, dir := range []string{agent.PinDir(), agent.RunDir(), agent.StateDir()} {
		if _, err := os.Stat(dir); err == nil {
			left = append(left, dir+" exists")
		}
	}
	conf := filepath.Join("/var/lib/shunt-lab/nodes", nd.name, "etc/cni/net.d")
	if entries, _ := os.ReadDir(conf); len(entries) > 0 {
		left = append(left, fmt.Sprintf("CNI configuration %s/%s", conf, entries[0].Name()))
	}
	plugin := filepath.Join("/var/lib/shunt-lab/nodes", nd.name, "opt/cni/bin/shunt-cni")
	if _, err := os.Stat(plugin); err == nil {
		left = append(left, "CNI plugin "+plugin)
	}
	if out, _ := exec.Command("ip", "-n", nd.netns, "-o", "link", "show").CombinedOutput(); true {
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(line)
			if len(f) > 1 {
				name := strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":")
				if name != "lo" && name != "ul0" {
					left = append(left, "interface "+name)
				}
			}
		}
	}
	if out, _ := exec.Command("ip", "-n", nd.netns, "route", "show").CombinedOutput(); true {
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if line != "" && !strings.Contains(line, "dev ul0 proto kernel") {
				left = append(left, "route "+line)
			}
		}
	}
	if out, _ := exec.Command("ip", "netns", "exec", nd.netns, "tc", "filter", "show", "dev", "ul0", "ingress").CombinedOutput(); len(strings.TrimSpace(string(out))) > 0 {
		left = append(left, "tc filters on ul0: "+strings.TrimSpace(string(out)))
	}
	return left
}
