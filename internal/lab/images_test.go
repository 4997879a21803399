package lab

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shuntnet/shunt/internal/kubecluster"
)

func TestImageArgv(t *testing.T) {
	im := Images{Agnhost: "/opt/kube/agnhost", Busybox: "/bin/busybox", CoreDNS: "/opt/kube/coredns", IstioEcho: "/opt/kube"}
	agnhost := "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	echo := "registry.k8s.io/gateway-api/echo-advanced:v1.5.1"
	cases := []struct {
		name, image   string
		command, args []string
		want          []string
	}{
		{"echo-advanced: args go to its entrypoint, Istio's echo server", echo, nil, []string{"--tcp=9090", "--port=8080", "--crt=/cert.crt"},
			[]string{"/opt/kube/istio-echo-server", "--tcp=9090", "--port=8080", "--crt=/cert.crt"}},
		{"echo-advanced: command /usr/local/bin/client", echo, []string{"/usr/local/bin/client", "http://echo"}, nil,
			[]string{"/opt/kube/istio-echo-client", "http://echo"}},
		{"agnhost: args pick the subcommand", agnhost, nil, []string{"netexec", "--http-port=8080", "--udp-port=8081"},
			[]string{"/opt/kube/agnhost", "netexec", "--http-port=8080", "--udp-port=8081"}},
		{"agnhost: the image's default is pause", agnhost, nil, nil, []string{"/opt/kube/agnhost", "pause"}},
		{"agnhost: command /agnhost", agnhost, []string{"/agnhost", "serve-hostname"}, []string{"--port", "9376"},
			[]string{"/opt/kube/agnhost", "serve-hostname", "--port", "9376"}},
		{"agnhost: its shell is alpine's busybox", agnhost, []string{"/bin/sh", "-c"}, []string{"sleep 1"},
			[]string{"/bin/busybox", "sh", "-c", "sleep 1"}},
		{"agnhost: a tool of the image the node has too", agnhost, []string{"curl", "-s", "http://x"}, nil,
			[]string{"curl", "-s", "http://x"}},
		{"agnhost by digest", "registry.k8s.io/e2e-test-images/agnhost@sha256:0123abcd", nil, []string{"porter"},
			[]string{"/opt/kube/agnhost", "porter"}},
		{"pause: any command is /pause", "registry.k8s.io/pause:3.10.2", nil, nil, []string{"/opt/kube/agnhost", "pause"}},
		{"busybox: the default is sh", "registry.k8s.io/e2e-test-images/busybox:1.37.0-2", nil, nil, []string{"/bin/busybox", "sh"}},
		{"busybox: commands are applets", "registry.k8s.io/e2e-test-images/busybox:1.37.0-2", []string{"/bin/sh", "-c", "echo hi"}, nil,
			[]string{"/bin/busybox", "sh", "-c", "echo hi"}},
		{"busybox: args keep no entrypoint", "busybox:1.36", nil, []string{"sleep", "3600"}, []string{"/bin/busybox", "sleep", "3600"}},
		{"busybox: Docker Hub's full name", "docker.io/library/busybox", []string{"wget", "-q"}, nil, []string{"/bin/busybox", "wget", "-q"}},
		{"glibc-dns-testing is Debian 12 with dig, as the node", "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1",
			[]string{"sh", "-c", "dig +short kubernetes.default"}, nil, []string{"sh", "-c", "dig +short kubernetes.default"}},
		{"coredns: args go to its entrypoint", "registry.k8s.io/coredns/coredns:v1.12.1", nil, []string{"-conf", "/etc/coredns/Corefile"},
			[]string{"/opt/kube/coredns", "-conf", "/etc/coredns/Corefile"}},
		{"coredns: command /coredns", "registry.k8s.io/coredns/coredns:v1.12.1", []string{"/coredns"}, []string{"-conf", "/c"},
			[]string{"/opt/kube/coredns", "-conf", "/c"}},
		{"lab image: the command is the node's", "debian:12", []string{"sleep", "infinity"}, nil, []string{"sleep", "infinity"}},
		{"lab image with args", "lab", []string{"shunt"}, []string{"lab", "serve"}, []string{"shunt", "lab", "serve"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := im.Argv(c.image, c.command, c.args)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("Argv(%q, %q, %q) = %q, want %q", c.image, c.command, c.args, got, c.want)
			}
		})
	}
}

func TestImageNotMapped(t *testing.T) {
	full := Images{Agnhost: "/opt/kube/agnhost", Busybox: "/bin/busybox"}
	cases := []struct {
		name    string
		im      Images
		image   string
		command []string
		want    string // in the message
	}{
		{"a registry's image shunt does not map", full, "registry.k8s.io/e2e-test-images/nginx:1.27.0-2", nil, "the lab runs only"},
		{"even with a command", full, "registry.k8s.io/e2e-test-images/nginx:1.27.0-2", []string{"nginx"}, "the lab runs only"},
		{"Docker Hub's image by full name", full, "docker.io/library/nginx:1.27", []string{"nginx"}, "the lab runs only"},
		{"a lab image needs a command", full, "nginx", nil, "needs a command"},
		{"agnhost not built", Images{Busybox: "/bin/busybox"}, "registry.k8s.io/e2e-test-images/agnhost:2.66.1", nil, "scripts/kube-build.sh agnhost"},
		{"pause without agnhost", Images{}, "registry.k8s.io/pause:3.10.2", nil, "scripts/kube-build.sh agnhost"},
		{"busybox not installed", Images{Agnhost: "/a"}, "busybox", nil, "busybox-static"},
		{"Istio's echo not built", full, "registry.k8s.io/gateway-api/echo-advanced:v1.5.1", nil, "scripts/kube-build.sh istio-echo"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			argv, err := c.im.Argv(c.image, c.command, nil)
			var nm *ImageNotMappedError
			if !errors.As(err, &nm) {
				t.Fatalf("Argv(%q) = %q, %v; want an ImageNotMappedError", c.image, argv, err)
			}
			if nm.Image != c.image || !strings.Contains(err.Error(), c.image) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q: want the image %q and %q in it", err, c.image, c.want)
			}
		})
	}
}

// A pod with an image the lab cannot run waits, saying which image, and is
// never started; its other containers wait too.
func TestPodWithUnmappedImageWaits(t *testing.T) {
	k := &kubelet{cfg: Config{Images: Images{Agnhost: "/opt/kube/agnhost", Busybox: "/bin/busybox"}}, pods: map[string]*PodRecord{}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "web"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "server", Image: "registry.k8s.io/e2e-test-images/nginx:1.27.0-2"},
		{Name: "sidecar", Image: "registry.k8s.io/e2e-test-images/agnhost:2.66.1", Args: []string{"pause"}},
	}}}
	k.pods["t/web"] = &PodRecord{Namespace: "t", Name: "web", IP: "10.244.0.9"}
	if k.runnable(pod) {
		t.Fatal("a pod with an unmapped image is runnable")
	}
	st := k.status(pod, "")
	if st.Phase != corev1.PodPending || len(st.ContainerStatuses) != 2 {
		t.Fatalf("status %+v: want Pending with both containers' statuses", st)
	}
	w := st.ContainerStatuses[0].State.Waiting
	if w == nil || w.Reason != ImageNotMappedReason || !strings.Contains(w.Message, "registry.k8s.io/e2e-test-images/nginx:1.27.0-2") {
		t.Fatalf("container server: state %+v, want waiting %s naming the image", st.ContainerStatuses[0].State, ImageNotMappedReason)
	}
	if w := st.ContainerStatuses[1].State.Waiting; w == nil || w.Reason != "ContainerCreating" {
		t.Fatalf("container sidecar: state %+v, want waiting ContainerCreating", st.ContainerStatuses[1].State)
	}
	if c := st.Conditions[0]; c.Status != corev1.ConditionFalse || !strings.Contains(c.Message, "nginx") {
		t.Fatalf("Ready condition %+v: want False naming the image", c)
	}
	pod.Spec.Containers[0].Image = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	if !k.runnable(pod) {
		t.Fatal("a pod of mapped images is not runnable")
	}
}

// The mapped programs are the real ones: Debian's busybox runs a shell
// command, and agnhost (when scripts/kube-build.sh built it) answers.
func TestMappedImagesRun(t *testing.T) {
	im := Images{Busybox: "/bin/busybox", Agnhost: filepath.Join(kubecluster.DefaultBinDir(), "agnhost")}
	if _, err := os.Stat(im.Busybox); err != nil {
		t.Skip("busybox-static is not installed: run scripts/setup.sh")
	}
	argv, err := im.Argv("busybox", []string{"sh", "-c", "echo $((6*7))"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(argv[0], argv[1:]...).Output()
	if err != nil || strings.TrimSpace(string(out)) != "42" {
		t.Fatalf("%q: %q, %v; want 42", argv, out, err)
	}
	if _, err := os.Stat(im.Agnhost); err != nil {
		t.Skipf("agnhost is not built (%v): run scripts/kube-build.sh agnhost", err)
	}
	argv, err = im.Argv("registry.k8s.io/e2e-test-images/agnhost:2.66.1", nil, []string{"--help"})
	if err != nil {
		t.Fatal(err)
	}
	out, _ = exec.Command(argv[0], argv[1:]...).CombinedOutput()
	for _, sub := range []string{"netexec", "serve-hostname", "porter", "connect", "pause"} {
		if !strings.Contains(string(out), sub) {
			t.Errorf("%q does not list the subcommand %s:\n%s", argv, sub, out)
		}
	}
}
