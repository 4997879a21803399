package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/lint/support"
	apps "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const chartDir = "../../deploy/helm/shunt"

// object is one rendered document: its kind and name, and its YAML.
type object struct {
	Kind, Name string
	Doc        []byte
}

func render(t *testing.T, rel Release, sets ...string) []object {
	t.Helper()
	vals, err := ParseSets(sets)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Template(chartDir, rel, vals, false)
	if err != nil {
		t.Fatalf("helm template --set %v: %v", sets, err)
	}
	var objs []object
	for _, doc := range strings.Split(m, "\n---\n") {
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("rendered document is not YAML: %v\n%s", err, doc)
		}
		if meta.Kind == "" {
			continue // a document of comments only
		}
		objs = append(objs, object{meta.Kind, meta.Metadata.Name, []byte(doc)})
	}
	return objs
}

func kinds(objs []object) []string {
	var k []string
	for _, o := range objs {
		k = append(k, o.Kind+"/"+o.Name)
	}
	return k
}

// daemonSet renders the chart and returns its DaemonSet and the agent
// and init containers.
func daemonSet(t *testing.T, rel Release, sets ...string) (ds apps.DaemonSet, agent, install *corev1.Container) {
	t.Helper()
	for _, o := range render(t, rel, sets...) {
		if o.Kind != "DaemonSet" {
			continue
		}
		if err := yaml.UnmarshalStrict(o.Doc, &ds); err != nil {
			t.Fatalf("the DaemonSet is not a valid apps/v1 DaemonSet: %v", err)
		}
		spec := &ds.Spec.Template.Spec
		for i := range spec.Containers {
			if spec.Containers[i].Name == "shuntd" {
				agent = &spec.Containers[i]
			}
		}
		for i := range spec.InitContainers {
			if spec.InitContainers[i].Name == "install-cni" {
				install = &spec.InitContainers[i]
			}
		}
		if agent == nil {
			t.Fatalf("the DaemonSet has no shuntd container")
		}
		return ds, agent, install
	}
	t.Fatal("no DaemonSet rendered")
	return
}

// shuntdFlags reads the flags shuntd defines from its source, so that the
// chart cannot pass one that does not exist.
func shuntdFlags(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile("../../cmd/shuntd/main.go")
	if err != nil {
		t.Fatal(err)
	}
	var flags []string
	for _, m := range regexp.MustCompile(`Flags\(\)\.\w+Var\(&[\w.]+, "([a-z0-9-]+)"`).FindAllSubmatch(src, -1) {
		flags = append(flags, string(m[1]))
	}
	if len(flags) < 10 {
		t.Fatalf("found only %v in cmd/shuntd/main.go: has the way flags are defined changed?", flags)
	}
	return flags
}

func checkArgsAreFlags(t *testing.T, args []string) {
	t.Helper()
	known := shuntdFlags(t)
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !slices.Contains(known, name) {
			t.Errorf("shuntd argument %q: shuntd has no such flag (cmd/shuntd/main.go)", a)
		}
	}
}

func TestLint(t *testing.T) {
	for _, sets := range [][]string{
		nil,
		{"securityContext.privileged=true", "prometheus.serviceMonitor.enabled=true", "masquerade=true",
			"routingMode=native", "image.digest=sha256:" + strings.Repeat("ab", 32), "cni.install=false", "relay.enabled=true"},
	} {
		vals, err := ParseSets(sets)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range Lint(chartDir, DefaultRelease, vals, support.WarningSev) {
			t.Errorf("helm lint --set %v: %s", sets, m)
		}
	}
}

// TestDefaults: what `helm install` with no values installs.
func TestDefaults(t *testing.T) {
	objs := render(t, DefaultRelease)
	want := []string{"ServiceAccount/shunt", "ClusterRole/shunt-agent", "ClusterRoleBinding/shunt-agent", "DaemonSet/shunt"}
	if got := kinds(objs); !slices.Equal(got, want) {
		t.Errorf("objects %v, want %v", got, want)
	}
	ds, agent, install := daemonSet(t, DefaultRelease)
	if agent.Image != "ghcr.io/shuntnet/shunt:dev" || install == nil || install.Image != agent.Image {
		t.Errorf("images: agent %q, install-cni %v; want the chart's appVersion", agent.Image, install)
	}
	if ds.Namespace != "shunt-system" || ds.Spec.Template.Spec.ServiceAccountName != "shunt" {
		t.Errorf("namespace %q, service account %q", ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName)
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || !spec.HostPID || len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != "Exists" {
		t.Errorf("hostNetwork %v hostPID %v tolerations %v", spec.HostNetwork, spec.HostPID, spec.Tolerations)
	}

	// Least privilege: no privileged, every capability dropped, the few
	// the agent needs added; the init container needs none.
	sc := agent.SecurityContext
	if sc == nil || sc.Privileged != nil && *sc.Privileged || sc.Capabilities == nil {
		t.Fatalf("agent securityContext %+v: want capabilities, not privileged", sc)
	}
	var added []string
	for _, c := range sc.Capabilities.Add {
		added = append(added, string(c))
	}
	if want := []string{"BPF", "PERFMON", "NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE", "DAC_OVERRIDE"}; !slices.Equal(added, want) {
		t.Errorf("agent capabilities added %v, want %v", added, want)
	}
	if len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("agent capabilities dropped %v, want ALL", sc.Capabilities.Drop)
	}
	if isc := install.SecurityContext; isc == nil || isc.Capabilities == nil || len(isc.Capabilities.Add) != 0 || isc.AllowPrivilegeEscalation == nil || *isc.AllowPrivilegeEscalation {
		t.Errorf("install-cni securityContext %+v: want no capability", isc)
	}
	for _, m := range agent.VolumeMounts {
		if m.MountPropagation != nil && *m.MountPropagation == "Bidirectional" {
			t.Errorf("mount %s is Bidirectional: the API server allows it only to privileged containers", m.Name)
		}
	}

	// Probes: the agent's own health, over its socket.
	for name, p := range map[string]*corev1.Probe{"startup": agent.StartupProbe, "readiness": agent.ReadinessProbe, "liveness": agent.LivenessProbe} {
		if p == nil || p.Exec == nil || !slices.Equal(p.Exec.Command, []string{"shunt", "status"}) || p.PeriodSeconds == 0 {
			t.Errorf("%s probe %+v: want `shunt status`", name, p)
		}
	}
	if agent.StartupProbe != nil && int(agent.StartupProbe.FailureThreshold*agent.StartupProbe.PeriodSeconds) < 120 {
		t.Errorf("startup probe allows %ds; the agent's first start may take 2 minutes", agent.StartupProbe.FailureThreshold*agent.StartupProbe.PeriodSeconds)
	}

	// The agent's flags, every one a flag of shuntd.
	want = []string{"--in-cluster", "--log-level=info", "--uninstall-when-removed", "--cni-files=/host/etc/cni/net.d/10-shunt.conflist,/host/opt/cni/bin/shunt-cni", "--routing=tunnel", "--tunnel=vxlan", "--cluster-cidr=10.244.0.0/16", "--metrics-addr=:9966"}
	if !slices.Equal(agent.Args, want) || !slices.Equal(agent.Command, []string{"shuntd"}) {
		t.Errorf("agent command %q args %q, want shuntd %q", agent.Command, agent.Args, want)
	}
	checkArgsAreFlags(t, agent.Args)
	if len(agent.Ports) != 1 || agent.Ports[0].Name != "metrics" || agent.Ports[0].ContainerPort != 9966 || agent.Ports[0].HostPort != 9966 {
		t.Errorf("ports %+v, want metrics 9966", agent.Ports)
	}

	// The CNI plugin: installed by shunt-install-cni (the image has no
	// shell) with the network configuration.
	if install.Command[0] != "shunt-install-cni" || !slices.ContainsFunc(install.Command, func(a string) bool {
		return strings.HasPrefix(a, `--conf={"cniVersion":"1.1.0","name":"shunt","plugins":[{"type":"shunt-cni"`)
	}) {
		t.Errorf("install-cni command %q", install.Command)
	}
}

// TestBesideKubeProxy: kubeProxyReplacement false reaches shuntd as
// --kube-proxy-replacement=false, and true adds no flag (its default).
func TestBesideKubeProxy(t *testing.T) {
	_, agent, _ := daemonSet(t, DefaultRelease, "kubeProxyReplacement=false")
	if !slices.Contains(agent.Args, "--kube-proxy-replacement=false") {
		t.Errorf("args %q: want --kube-proxy-replacement=false", agent.Args)
	}
	checkArgsAreFlags(t, agent.Args)
	_, agent, _ = daemonSet(t, DefaultRelease, "kubeProxyReplacement=true")
	if slices.ContainsFunc(agent.Args, func(a string) bool { return strings.HasPrefix(a, "--kube-proxy-replacement") }) {
		t.Errorf("args %q: true is shuntd's default, no flag", agent.Args)
	}
}

// TestValuesMapToFlags: the Cilium-named values reach shuntd as its flags.
func TestValuesMapToFlags(t *testing.T) {
	digest := "sha256:" + strings.Repeat("0f", 32)
	_, agent, _ := daemonSet(t, DefaultRelease,
		"routingMode=native", "masquerade=true", "masqueradeExclude={10.0.0.0/8,192.168.0.0/16}", "loadBalancer.mode=hybrid", "nodePort.addresses={primary,127.0.0.0/8}", "conntrackMax=524288", "socketAcceleration=true",
		"socketAccelerationWithoutBackpressure=true", "kernelFallbacks=all", "removeKubeProxyRules=true", "serviceCIDR=10.96.0.0/12", "clusterCIDR=10.32.0.0/12", "logLevel=debug", "prometheus.port=9100",
		"image.repository=registry.example/shunt", "image.digest="+digest, "k8sServiceHost=192.0.2.10", "k8sServicePort=6443",
		"extraArgs={--drift-check-period=1m}")
	want := []string{"--in-cluster", "--log-level=debug", "--uninstall-when-removed", "--cni-files=/host/etc/cni/net.d/10-shunt.conflist,/host/opt/cni/bin/shunt-cni", "--routing=native", "--cluster-cidr=10.32.0.0/12", "--service-cidr=10.96.0.0/12",
		"--masquerade", "--masquerade-exclude=10.0.0.0/8,192.168.0.0/16", "--nodeport-mode=hybrid", "--nodeport-addresses=primary,127.0.0.0/8", "--conntrack-max=524288", "--socket-acceleration", "--accelerate-without-backpressure", "--kernel-fallbacks=all",
		"--remove-kube-proxy-rules", "--metrics-addr=:9100", "--drift-check-period=1m"}
	if !slices.Equal(agent.Args, want) {
		t.Errorf("args\n %q\nwant\n %q", agent.Args, want)
	}
	checkArgsAreFlags(t, agent.Args)
	if agent.Image != "registry.example/shunt@"+digest {
		t.Errorf("image %q: want pinned by digest", agent.Image)
	}
	env := map[string]string{}
	for _, e := range agent.Env {
		env[e.Name] = e.Value
	}
	if env["KUBERNETES_SERVICE_HOST"] != "192.0.2.10" || env["KUBERNETES_SERVICE_PORT"] != "6443" {
		t.Errorf("env %v: want the API server's own address", env)
	}

	_, agent, install := daemonSet(t, DefaultRelease, "routingMode=", "prometheus.enabled=false", "image.tag=v1.2.3", "image.digest="+digest, "cni.install=false")
	if want := []string{"--in-cluster", "--log-level=info", "--uninstall-when-removed", "--cluster-cidr=10.244.0.0/16"}; !slices.Equal(agent.Args, want) {
		t.Errorf("args %q, want %q", agent.Args, want)
	}
	if agent.Image != "ghcr.io/shuntnet/shunt:v1.2.3@"+digest || len(agent.Ports) != 0 || install != nil {
		t.Errorf("image %q ports %v install-cni %v", agent.Image, agent.Ports, install)
	}
}

// TestPrivileged: the escape hatch for kernels and runtimes that refuse
// the capabilities.
func TestPrivileged(t *testing.T) {
	_, agent, install := daemonSet(t, DefaultRelease, "securityContext.privileged=true")
	for _, c := range []*corev1.Container{agent, install} {
		if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged || sc.Capabilities != nil {
			t.Errorf("%s securityContext %+v: want privileged alone", c.Name, sc)
		}
	}
	for _, m := range agent.VolumeMounts {
		if m.Name == "bpffs" && (m.MountPropagation == nil || *m.MountPropagation != "Bidirectional") {
			t.Errorf("bpffs mount %+v: a privileged agent mounts bpffs for the node (Bidirectional)", m)
		}
	}
}

// TestAppArmorOnOlderKubernetes: the securityContext field from 1.30, the
// annotation before.
func TestAppArmorOnOlderKubernetes(t *testing.T) {
	old := DefaultRelease
	old.KubeVersion = "v1.29.0"
	ds, agent, _ := daemonSet(t, old)
	if agent.SecurityContext.AppArmorProfile != nil || ds.Spec.Template.Annotations["container.apparmor.security.beta.kubernetes.io/shuntd"] != "unconfined" {
		t.Errorf("1.29: field %v annotations %v", agent.SecurityContext.AppArmorProfile, ds.Spec.Template.Annotations)
	}
	// No profile asked: neither, on either version.
	for _, rel := range []Release{old, DefaultRelease} {
		ds, agent, _ := daemonSet(t, rel, "securityContext.appArmorProfile=null")
		if agent.SecurityContext.AppArmorProfile != nil || len(ds.Spec.Template.Annotations) != 0 {
			t.Errorf("%s without a profile: field %v annotations %v", rel.KubeVersion, agent.SecurityContext.AppArmorProfile, ds.Spec.Template.Annotations)
		}
	}
	ds, agent, _ = daemonSet(t, DefaultRelease)
	if agent.SecurityContext.AppArmorProfile == nil || agent.SecurityContext.AppArmorProfile.Type != "Unconfined" || len(ds.Spec.Template.Annotations) != 0 {
		t.Errorf("1.37: field %v annotations %v", agent.SecurityContext.AppArmorProfile, ds.Spec.Template.Annotations)
	}
}

func TestServiceMonitor(t *testing.T) {
	rel := DefaultRelease
	rel.APIVersions = []string{"monitoring.coreos.com/v1"}
	objs := render(t, rel, "prometheus.serviceMonitor.enabled=true", "prometheus.serviceMonitor.labels.release=prom")
	got := kinds(objs)
	for _, w := range []string{"Service/shunt-metrics", "ServiceMonitor/shunt"} {
		if !slices.Contains(got, w) {
			t.Errorf("objects %v lack %s", got, w)
		}
	}
	for _, o := range objs {
		if o.Kind == "ServiceMonitor" && (!bytes.Contains(o.Doc, []byte("release: prom")) || !bytes.Contains(o.Doc, []byte("port: metrics"))) {
			t.Errorf("ServiceMonitor:\n%s", o.Doc)
		}
	}
}

// TestRefusesWhatIsNotImplemented: a value shunt cannot honour fails the
// install by name instead of being ignored.
func TestRefusesWhatIsNotImplemented(t *testing.T) {
	for set, want := range map[string]string{
		"kubeProxyReplacement=partial":                         "kubeProxyReplacement",
		"kubeProxyReplacement=false,removeKubeProxyRules=true": "removeKubeProxyRules",
		"l7Proxy=false":                      "l7Proxy",
		"tunnelProtocol=geneve":              "tunnelProtocol",
		"routingMode=bgp":                    "routingMode",
		"routingMode=,loadBalancer.mode=dsr": "needs routingMode native or tunnel",
		// values.schema.json: types, ranges, and no unknown keys
		"masquerade=yes":                 "masquerade",
		"routingmode=native":             "routingmode",
		"prometheus.port=70000":          "port",
		"image.digest=latest":            "digest",
		"logLevel=verbose":               "logLevel",
		"loadBalancer.mode=DSR":          "mode",
		"nodePort.addresses={127.0.0.1}": "addresses",
	} {
		vals, _ := ParseSets([]string{set})
		if _, err := Template(chartDir, DefaultRelease, vals, false); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--set %s: %v, want a refusal naming %s", set, err, want)
		}
	}
	// DSR goes with the overlay (the default routingMode) too.
	vals, _ := ParseSets([]string{"loadBalancer.mode=dsr"})
	if _, err := Template(chartDir, DefaultRelease, vals, false); err != nil {
		t.Errorf("--set loadBalancer.mode=dsr with routingMode tunnel: %v, want it rendered", err)
	}
}

// TestCRDsAreDeployCRDs: the chart's crds/ is deploy/crds (a symbolic
// link, not a copy that could drift).
func TestCRDsAreDeployCRDs(t *testing.T) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("../../deploy/crds/*.yaml")
	crds := chrt.CRDObjects()
	if len(files) == 0 || len(crds) != len(files) {
		t.Fatalf("chart CRDs %d, deploy/crds %d", len(crds), len(files))
	}
	for _, c := range crds {
		data, err := os.ReadFile(filepath.Join("../../deploy/crds", filepath.Base(c.Filename)))
		if err != nil || !bytes.Equal(data, c.File.Data) {
			t.Errorf("chart CRD %s differs from deploy/crds: %v", c.Filename, err)
		}
	}
}

// TestManifestIsGenerated: deploy/shunt.yaml is the chart with its
// defaults (`make generate` writes it; CI's check-generated fails on a
// stale one too, this says which way).
func TestManifestIsGenerated(t *testing.T) {
	m, err := Template(chartDir, DefaultRelease, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	if err := writeManifest(&want, DefaultRelease, m); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../deploy/shunt.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Errorf("deploy/shunt.yaml is not the chart's default rendering: run `make generate` and commit it")
	}
}

// TestPackage: the archive holds the CRDs as files (the link resolved),
// the templates, and the appVersion asked, and installs like the
// directory.
func TestPackage(t *testing.T) {
	path, err := Package(chartDir, t.TempDir(), "v9.9.9")
	if err != nil {
		t.Fatal(err)
	}
	chrt, err := loader.Load(path)
	if err != nil {
		t.Fatalf("loading %s: %v", path, err)
	}
	files, _ := filepath.Glob("../../deploy/crds/*.yaml")
	if got := len(chrt.CRDObjects()); got != len(files) || got == 0 {
		t.Errorf("%s holds %d CRDs, deploy/crds %d", path, got, len(files))
	}
	if chrt.Metadata.AppVersion != "v9.9.9" || len(chrt.Templates) == 0 {
		t.Errorf("appVersion %q, %d templates", chrt.Metadata.AppVersion, len(chrt.Templates))
	}
	m, err := Template(path, DefaultRelease, nil, false)
	if err != nil || !strings.Contains(m, "image: ghcr.io/shuntnet/shunt:v9.9.9") || strings.Contains(m, "shunt:dev") {
		t.Errorf("the packaged chart: %v, want the image tagged with its appVersion\n%s", err, m)
	}
}

// TestKubeVersionIsTheTestedOne: the chart is rendered for the Kubernetes
// release shunt's tests run (tools/kube/go.mod), so a move to another one
// moves this too.
func TestKubeVersionIsTheTestedOne(t *testing.T) {
	mod, err := os.ReadFile("../kube/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes (v\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("no k8s.io/kubernetes version in tools/kube/go.mod")
	}
	if string(m[1]) != DefaultRelease.KubeVersion {
		t.Errorf("DefaultRelease.KubeVersion %s, tools/kube pins %s", DefaultRelease.KubeVersion, m[1])
	}
}

// TestRelay: with relay.enabled the agents serve their flows by mutual TLS
// (flags that shuntd has, the agent's Secret mounted), and the relay runs
// `shunt relay` with flags it has, on its pod's loopback, reading the agent
// pods of the release's namespace; both Secrets hold certificates of one
// CA, for server and client use.
func TestRelay(t *testing.T) {
	_, agent, _ := daemonSet(t, DefaultRelease, "relay.enabled=true", "relay.agentPort=4300")
	if !slices.Contains(agent.Args, "--flows-addr=:4300") || !slices.Contains(agent.Args, "--flows-tls-dir=/etc/shunt/flows-tls") {
		t.Errorf("agent args %q: want --flows-addr=:4300 and --flows-tls-dir", agent.Args)
	}
	checkArgsAreFlags(t, agent.Args)
	if !slices.ContainsFunc(agent.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/etc/shunt/flows-tls" && m.ReadOnly }) {
		t.Errorf("agent mounts %v: want the flows TLS Secret at /etc/shunt/flows-tls", agent.VolumeMounts)
	}
	var relay apps.Deployment
	secrets := map[string]corev1.Secret{}
	for _, o := range render(t, DefaultRelease, "relay.enabled=true", "relay.agentPort=4300") {
		switch o.Kind {
		case "Deployment":
			if err := yaml.UnmarshalStrict(o.Doc, &relay); err != nil {
				t.Fatal(err)
			}
		case "Secret":
			var s corev1.Secret
			if err := yaml.UnmarshalStrict(o.Doc, &s); err != nil {
				t.Fatal(err)
			}
			secrets[s.Name] = s
		}
	}
	if len(relay.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("relay Deployment %+v: want one container", relay)
	}
	c := relay.Spec.Template.Spec.Containers[0]
	want := []string{"relay", "--in-cluster", "--namespace=shunt-system", "--selector=app.kubernetes.io/name=shunt",
		"--agent-port=4300", "--agent-tls-dir=/etc/shunt/flows-tls", "--listen=127.0.0.1:4245"}
	if !slices.Equal(c.Command, []string{"shunt"}) || !slices.Equal(c.Args, want) {
		t.Errorf("relay runs %q %q, want shunt %q", c.Command, c.Args, want)
	}
	relaySrc, err := os.ReadFile("../../cmd/shunt/relay.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range c.Args[1:] {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.Contains(string(relaySrc), `"`+name+`"`) {
			t.Errorf("relay argument %q: shunt relay has no such flag (cmd/shunt/relay.go)", a)
		}
	}
	agentTLS, relayTLS := secrets["shunt-flows-agent-tls"], secrets["shunt-flows-relay-tls"]
	if len(agentTLS.Data["ca.crt"]) == 0 || string(agentTLS.Data["ca.crt"]) != string(relayTLS.Data["ca.crt"]) {
		t.Fatalf("flows Secrets %v: want both with the same ca.crt", secrets)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(agentTLS.Data["ca.crt"]) {
		t.Fatal("ca.crt holds no certificate")
	}
	for name, usage := range map[string]x509.ExtKeyUsage{"shunt-flows-agent-tls": x509.ExtKeyUsageServerAuth, "shunt-flows-relay-tls": x509.ExtKeyUsageClientAuth} {
		s := secrets[name]
		if _, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"]); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		block, _ := pem.Decode(s.Data["tls.crt"])
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("%s: its certificate does not verify against the CA for %v: %v", name, usage, err)
		}
	}
}
