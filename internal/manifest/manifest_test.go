package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

const good = `
# comment-only documents are skipped
---
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {team: shop}}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: shop, labels: {app: web}}
spec:
  containers:
  - name: c
    command: [sleep, infinity]
    ports: [{name: http, containerPort: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  selector: {app: web}
  sessionAffinity: ClientIP
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.0.0.5]}]
ports: [{port: 80}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: shop}
spec:
  podSelector: {}
  egress: [{}]
---
apiVersion: shunt.io/v1alpha1
kind: ShuntNetworkPolicy
metadata: {name: l7, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - peers: [{entity: world}]
    http: [{method: GET, path: /api/.*}]
`

func TestParseAllKindsWithDefaults(t *testing.T) {
	objs, err := Parse("good.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(objs); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.Kind())
	}
	if got := strings.Join(kinds, ","); got != "Namespace,Pod,Service,EndpointSlice,NetworkPolicy,ShuntNetworkPolicy" {
		t.Fatalf("kinds %s", got)
	}
	if objs[1].Source != "good.yaml#3" {
		t.Errorf("source %q, want good.yaml#3 (documents counted from 1, empty ones included)", objs[1].Source)
	}
	pod := objs[1].Obj.(*corev1.Pod)
	if pod.Spec.Containers[0].Ports[0].Protocol != corev1.ProtocolTCP {
		t.Error("container port protocol not defaulted")
	}
	svc := objs[2].Obj.(*corev1.Service)
	if svc.Spec.Ports[0].TargetPort.IntVal != 80 || svc.Spec.Type != corev1.ServiceTypeClusterIP ||
		*svc.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds != 10800 {
		t.Errorf("service defaults: %+v", svc.Spec)
	}
	if objs[3].Obj.(*discoveryv1.EndpointSlice).Namespace != "shop" {
		t.Error("endpointslice namespace")
	}
	np := objs[4].Obj.(*networkingv1.NetworkPolicy)
	if len(np.Spec.PolicyTypes) != 2 {
		t.Errorf("policyTypes defaulted to %v, want [Ingress Egress]", np.Spec.PolicyTypes)
	}
	snp := objs[5].Obj.(*ShuntNetworkPolicy)
	if snp.Spec.Ingress[0].Action != "allow" {
		t.Error("shunt policy action not defaulted")
	}
	if objs[5].Key() != "ShuntNetworkPolicy/shop/l7" || objs[0].Key() != "Namespace//shop" {
		t.Errorf("keys %s %s", objs[5].Key(), objs[0].Key())
	}
	if c, ok := snp.DeepCopyObject().(*ShuntNetworkPolicy); !ok || c.Spec.Ingress[0].HTTP[0].Path != "/api/.*" {
		t.Error("deep copy lost fields")
	}
}

func TestRejections(t *testing.T) {
	pod := func(spec string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n" + spec
	}
	cases := []struct {
		name, doc, want string
	}{
		{"unknown kind", "apiVersion: v1\nkind: Deployment\nmetadata: {name: x}", `x.yaml#1: kind: unknown kind "Deployment"`},
		{"wrong apiVersion", "apiVersion: v2\nkind: Pod\nmetadata: {name: x}", `x.yaml#1: Pod: apiVersion: "v2" is not served`},
		{"unknown field", pod("  containers: [{name: c, command: [x], comand: [y]}]"), `x.yaml#1: Pod p: unknown field "spec.containers[0].comand"`},
		{"no command", pod("  containers: [{name: c}]"), `x.yaml#1: Pod default/p: spec.containers[0].command: required`},
		{"bad port", pod("  containers: [{name: c, command: [x], ports: [{containerPort: 70000}]}]"), `spec.containers[0].ports[0].containerPort: 70000 is out of range`},
		{"bad protocol", pod("  containers: [{name: c, command: [x], ports: [{containerPort: 80, protocol: ICMP}]}]"), `spec.containers[0].ports[0].protocol: unsupported protocol "ICMP"`},
		{"bad name", "apiVersion: v1\nkind: Pod\nmetadata: {name: Bad_Name}\nspec: {containers: [{name: c, command: [x]}]}", `Pod default/Bad_Name: metadata.name:`},
		{"bad label", "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {a: 'b c'}}\nspec: {containers: [{name: c, command: [x]}]}", `metadata.labels[a]`},
		{"duplicate", pod("  containers: [{name: c, command: [x]}]") + "\n---\n" + pod("  containers: [{name: c, command: [x]}]"), `x.yaml#2: Pod default/p: metadata.name: duplicate: Pod default/p is also defined in x.yaml#1`},
		{"service port", "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: 0}]}", `Service default/s: spec.ports[0].port: 0 is out of range`},
		{"service clusterIP", "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {clusterIP: 10.0.0.300, ports: [{port: 80}]}", `spec.clusterIP: "10.0.0.300" is not an IP address`},
		{"service unnamed ports", "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: 80}, {port: 81, name: b}]}", `spec.ports[0].name: required`},
		{"slice without service", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: e}\naddressType: IPv4\nendpoints: [{addresses: ['10.0.0.1']}]", `metadata.labels[kubernetes.io/service-name]: required`},
		{"slice address family", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: e, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nendpoints: [{addresses: ['::1']}]", `endpoints[0].addresses[0]: "::1" is not an IPv4 address`},
		{"endPort below port", "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np}\nspec: {podSelector: {}, ingress: [{ports: [{port: 90, endPort: 80}]}]}", `spec.ingress[0].ports[0].endPort: 80 is below port 90`},
		{"except outside cidr", "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np}\nspec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/16]}}]}]}", `from[0].ipBlock.cidr.except[0]`},
		{"bad selector", "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np}\nspec: {podSelector: {matchExpressions: [{key: a, operator: Bogus}]}}", `spec.podSelector:`},
		{"bad action", "apiVersion: shunt.io/v1alpha1\nkind: ShuntNetworkPolicy\nmetadata: {name: np}\nspec: {podSelector: {}, ingress: [{action: drop}]}", `spec.ingress[0].action: "drop"`},
		{"namespaced namespace", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, namespace: b}", `metadata.namespace: must be empty`},
		{"not yaml", "a: [", `x.yaml#1: not valid YAML`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			objs, err := Parse("x.yaml", []byte(c.doc))
			if err == nil {
				err = Validate(objs)
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v\nwant it to contain %q", err, c.want)
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	objs, err := Parse("x.yaml", []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c}, {name: c, command: [x]}]}"))
	if err != nil {
		t.Fatal(err)
	}
	errs, ok := Validate(objs).(Errors)
	if !ok || len(errs) != 2 {
		t.Fatalf("want 2 problems (missing command, duplicate container), got %v", errs)
	}
}

func TestLoadDirectoryAndStdin(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "b.yaml"), []byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "sub", "a.yml"), []byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not a manifest"), 0o644)
	list := `{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "c"}}]}`
	objs, err := Load([]string{dir, "-"}, strings.NewReader(list))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range objs {
		_, n := o.NamespaceName()
		names = append(names, n+"@"+filepath.Base(o.Source))
	}
	if got := strings.Join(names, " "); got != "b@b.yaml#1 a@a.yml#1 c@<stdin>#1 items[0]" {
		t.Errorf("loaded %s", got)
	}
	if _, err := Load([]string{filepath.Join(dir, "missing.yaml")}, nil); err == nil {
		t.Error("missing file accepted")
	}
}
