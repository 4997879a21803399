package lab

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func service(ns, name, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{ClusterIP: clusterIP, Ports: ports}}
}

// The Service variables are kubelet's, name for name and value for value
// (pkg/kubelet/envvars's own test cases: the first port unnamed-compatible,
// named ports, Docker's link variables with the protocol in lower and upper
// case).
func TestServiceEnvVars(t *testing.T) {
	s := service("ns", "super-ser", "9.8.7.6",
		corev1.ServicePort{Name: "u-d-p", Protocol: corev1.ProtocolUDP, Port: 8083},
		corev1.ServicePort{Name: "t-c-p", Protocol: corev1.ProtocolTCP, Port: 8084})
	want := []string{
		"SUPER_SER_SERVICE_HOST=9.8.7.6",
		"SUPER_SER_SERVICE_PORT=8083",
		"SUPER_SER_SERVICE_PORT_U_D_P=8083",
		"SUPER_SER_SERVICE_PORT_T_C_P=8084",
		"SUPER_SER_PORT=udp://9.8.7.6:8083",
		"SUPER_SER_PORT_8083_UDP=udp://9.8.7.6:8083",
		"SUPER_SER_PORT_8083_UDP_PROTO=udp",
		"SUPER_SER_PORT_8083_UDP_PORT=8083",
		"SUPER_SER_PORT_8083_UDP_ADDR=9.8.7.6",
		"SUPER_SER_PORT_8084_TCP=tcp://9.8.7.6:8084",
		"SUPER_SER_PORT_8084_TCP_PROTO=tcp",
		"SUPER_SER_PORT_8084_TCP_PORT=8084",
		"SUPER_SER_PORT_8084_TCP_ADDR=9.8.7.6",
	}
	var got []string
	for _, e := range serviceEnvVars(s) {
		got = append(got, e.Name+"="+e.Value)
	}
	if !slices.Equal(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	v6 := serviceEnvVars(service("ns", "v6", "fd00::1", corev1.ServicePort{Port: 80}))
	if v6[2].Name != "V6_PORT" || v6[2].Value != "tcp://[fd00::1]:80" {
		t.Errorf("IPv6 link variable %+v: want tcp://[fd00::1]:80 (no protocol is TCP)", v6[2])
	}
}

// Which Services a pod is told of: default/kubernetes always, its own
// namespace's with enableServiceLinks, never a headless one or another
// namespace's.
func TestServiceEnvSelection(t *testing.T) {
	all := []*corev1.Service{
		service("default", "kubernetes", "10.0.0.1", corev1.ServicePort{Name: "https", Port: 443}),
		service("ns", "web", "10.0.0.20", corev1.ServicePort{Port: 80}),
		service("ns", "headless", corev1.ClusterIPNone, corev1.ServicePort{Port: 80}),
		service("other", "db", "10.0.0.30", corev1.ServicePort{Port: 5432}),
	}
	links := serviceEnv(all, "ns", true)
	for _, want := range []string{"KUBERNETES_SERVICE_HOST=10.0.0.1", "KUBERNETES_SERVICE_PORT=443", "KUBERNETES_SERVICE_PORT_HTTPS=443",
		"KUBERNETES_PORT=tcp://10.0.0.1:443", "KUBERNETES_PORT_443_TCP_ADDR=10.0.0.1", "WEB_SERVICE_HOST=10.0.0.20"} {
		name, v, _ := strings.Cut(want, "=")
		if links[name] != v {
			t.Errorf("%s = %q, want %q", name, links[name], v)
		}
	}
	for _, name := range []string{"HEADLESS_SERVICE_HOST", "DB_SERVICE_HOST"} {
		if _, ok := links[name]; ok {
			t.Errorf("%s set: a headless Service and another namespace's are not told", name)
		}
	}
	noLinks := serviceEnv(all, "ns", false)
	if noLinks["KUBERNETES_SERVICE_HOST"] != "10.0.0.1" || noLinks["WEB_SERVICE_HOST"] != "" {
		t.Errorf("enableServiceLinks=false: %v, want only the kubernetes Service's", noLinks)
	}
}

func TestExpandVars(t *testing.T) {
	vars := map[string]string{"A": "a", "EMPTY": ""}
	lookup := func(n string) (string, bool) { v, ok := vars[n]; return v, ok }
	for in, want := range map[string]string{
		"$(A)":        "a",
		"x$(A)y$(A)":  "xaya",
		"$(EMPTY)z":   "z",
		"$(UNKNOWN)":  "$(UNKNOWN)",
		"$$(A)":       "$(A)",
		"$$":          "$",
		"$A":          "$A",
		"$(A":         "$(A",
		"trailing $":  "trailing $",
		"$(A)$(A)$$x": "aa$x",
	} {
		if got := expandVars(in, lookup); got != want {
			t.Errorf("expandVars(%q) = %q, want %q", in, got, want)
		}
	}
}

// A container's environment: envFrom (prefix), env in order with $(VAR)
// of earlier ones and of the Services, each valueFrom kind, a missing
// optional source leaving no variable, the Services' variables unless the
// container sets the name, and the errors kubelet gives for a missing
// ConfigMap or key.
func TestPodEnv(t *testing.T) {
	yes := true
	k := &kubelet{cfg: Config{NodeIP: netip.MustParseAddr("192.0.2.7")},
		objects: objectsOf{
			configMaps: map[string]*corev1.ConfigMap{"ns/cm": {Data: map[string]string{"color": "blue", "size": "L"}}},
			secrets:    map[string]*corev1.Secret{"ns/s": {Data: map[string][]byte{"pw": []byte("hunter2")}}},
		},
		services: func() []*corev1.Service {
			return []*corev1.Service{
				service("default", "kubernetes", "10.0.0.1", corev1.ServicePort{Name: "https", Port: 443}),
				service("ns", "web", "10.0.0.20", corev1.ServicePort{Port: 80}),
			}
		}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: map[string]string{"app": "x"}},
		Spec: corev1.PodSpec{NodeName: "n1"}}
	c := corev1.Container{Name: "c",
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")},
			Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}},
		EnvFrom: []corev1.EnvFromSource{{Prefix: "CM_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}},
		Env: []corev1.EnvVar{
			{Name: "WEB", Value: "http://$(WEB_SERVICE_HOST):$(WEB_SERVICE_PORT)/$(CM_color)"},
			{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			{Name: "HOST_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
			{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
			{Name: "CPU_M", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "requests.cpu", Divisor: resource.MustParse("1m")}}},
			{Name: "CPU", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "requests.cpu"}}},
			{Name: "MEM_MI", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
			{Name: "SIZE", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Key: "size"}}},
			{Name: "PW", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "pw"}}},
			{Name: "GONE", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Key: "k", Optional: &yes}}},
			{Name: "WEB_SERVICE_PORT", Value: "8080"},
		}}
	env, err := k.podEnv(pod, &PodRecord{IP: "10.1.0.5"}, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"WEB=http://10.0.0.20:80/blue", // expanded before WEB_SERVICE_PORT is set: the Service's
		"NODE=n1", "HOST_IP=192.0.2.7", "APP=x", "CPU_M=250", "CPU=1", "MEM_MI=64", "SIZE=L", "PW=hunter2",
		"CM_color=blue", "CM_size=L", "WEB_SERVICE_PORT=8080", "WEB_SERVICE_HOST=10.0.0.20",
		"KUBERNETES_SERVICE_HOST=10.0.0.1", "KUBERNETES_SERVICE_PORT=443", "KUBERNETES_PORT_443_TCP=tcp://10.0.0.1:443",
	} {
		if !slices.Contains(env, want) {
			t.Errorf("env lacks %s:\n%s", want, strings.Join(env, "\n"))
		}
	}
	if slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "GONE=") }) {
		t.Error("a missing optional ConfigMap's variable was set")
	}
	// A limit the container does not set is the node's allocatable.
	alloc := k.allocatable()[corev1.ResourceCPU]
	c.Env = []corev1.EnvVar{{Name: "LIM", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}}}
	if env, err := k.podEnv(pod, &PodRecord{}, c); err != nil || !slices.Contains(env, "LIM="+alloc.String()) {
		t.Errorf("limits.cpu without a limit: %v %v, want the node's allocatable %s", env, err, alloc.String())
	}
	for _, e := range []corev1.EnvVar{
		{Name: "X", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Key: "k"}}},
		{Name: "X", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "nokey"}}},
	} {
		c.Env, c.EnvFrom = []corev1.EnvVar{e}, nil
		if _, err := k.podEnv(pod, &PodRecord{}, c); err == nil {
			t.Errorf("%+v: no error for a missing, not optional source", e.ValueFrom)
		}
	}
	// enableServiceLinks: false keeps the kubernetes Service's only.
	pod.Spec.EnableServiceLinks = new(bool)
	c.Env = nil
	env, _ = k.podEnv(pod, &PodRecord{}, c)
	if !slices.Contains(env, "KUBERNETES_SERVICE_HOST=10.0.0.1") || slices.Contains(env, "WEB_SERVICE_HOST=10.0.0.20") {
		t.Errorf("enableServiceLinks false: %q", env)
	}
}

func TestExpandCommand(t *testing.T) {
	c := expandCommand(corev1.Container{Command: []string{"/bin/sh", "-c", "echo $(MSG) $$(MSG)"}, Args: []string{"--port=$(PORT)"}},
		[]string{"MSG=hi", "PORT=8080"})
	if !slices.Equal(c.Command, []string{"/bin/sh", "-c", "echo hi $(MSG)"}) || !slices.Equal(c.Args, []string{"--port=8080"}) {
		t.Errorf("command %q args %q", c.Command, c.Args)
	}
}

// The Node's capacity and system information are the machine's, as
// kubelet reports them; allocatable holds back the eviction thresholds.
func TestMachineStatus(t *testing.T) {
	st, _ := machineStatus()
	cpu, mem, pods := st.Capacity[corev1.ResourceCPU], st.Capacity[corev1.ResourceMemory], st.Capacity[corev1.ResourcePods]
	if cpu.Value() < 1 || mem.Value() < 100<<20 || pods.Value() != 110 {
		t.Errorf("capacity %v", st.Capacity)
	}
	amem := st.Allocatable[corev1.ResourceMemory]
	if mem.Value()-amem.Value() != evictionMemory {
		t.Errorf("allocatable memory %s, capacity %s: want 100Mi held back", amem.String(), mem.String())
	}
	in := st.NodeInfo
	if in.KernelVersion == "" || in.OSImage == "" || in.OperatingSystem != "linux" || in.Architecture == "" ||
		in.KubeletVersion == "" || !strings.HasPrefix(in.ContainerRuntimeVersion, "shunt-lab://") || in.BootID == "" {
		t.Errorf("nodeInfo %+v", in)
	}
	if got := osImage("NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n"); got != "Debian GNU/Linux 12 (bookworm)" {
		t.Errorf("osImage %q", got)
	}
	node := &corev1.Node{Status: corev1.NodeStatus{Capacity: st.Capacity.DeepCopy(), Allocatable: st.Allocatable.DeepCopy(), NodeInfo: st.NodeInfo}}
	if !machineStatusCurrent(node) {
		t.Error("a Node with the machine's status is not current")
	}
	node.Status.NodeInfo.KernelVersion = "old"
	if machineStatusCurrent(node) {
		t.Error("a Node with another kernel is current")
	}
}
