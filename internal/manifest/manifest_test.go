package manifest

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// good has every supported kind, relying on every default.
const good = `# A leading comment and empty documents are not counted.
---
---
apiVersion: v1
kind: Namespace
metadata:
  name: shop
  labels: {team: shop}
---
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: shop
  labels: {app: web}
spec:
  containers:
  - name: server
    image: informational/only
    command: [shunt-lab, serve]
    args: [--port, "8080"]
    ports:
    - {name: http, containerPort: 8080}
---
apiVersion: v1
kind: Pod
metadata:
  name: client
spec:
  containers:
  - name: c
    command: [sleep, infinity]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  selector: {app: web}
  sessionAffinity: ClientIP
  ports:
  - {name: http, port: 80, targetPort: http}
  - {name: alt, port: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [10.0.0.5]
ports:
- port: 8080
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from:
    - namespaceSelector: {}
    - ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}
    ports:
    - {port: 8000, endPort: 8100}
  egress: [{}]
---
apiVersion: shunt.io/v1alpha1
kind: ShuntNetworkPolicy
metadata: {name: l7, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - peers: [{entity: world}, {cidr: "fd00::/64", except: ["fd00::/80"]}]
    ports: [{port: http}]
    http: [{method: GET, path: "/api/.*", headers: {X-Team: shop}}]
  egress:
  - action: deny
    peers: [{podSelector: {matchLabels: {app: db}}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: web, port: 80}]
  rules:
  - matches: [{headers: [{name: x-canary, value: "true"}]}]
    backendRefs: [{name: web, port: 8080}]
  - matches:
    - path: {type: RegularExpression, value: "/api/v[0-9]+/.*"}
      method: GET
      queryParams: [{name: debug, value: "1"}]
    backendRefs:
    - {name: web, port: 80, weight: 90}
    - {name: web, port: 8080, weight: 10}
    timeouts: {request: 10s, backendRequest: 1s500ms}
    retry: {attempts: 2, codes: [502, 503], backoff: 100ms}
  - backendRefs: [{name: web, port: 80, weight: 0}]
...
`

func mustParse(t *testing.T, source, doc string) []Object {
	t.Helper()
	objs, err := Parse(source, []byte(doc))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return objs
}

func TestParseAllKindsWithDefaults(t *testing.T) {
	objs := mustParse(t, "good.yaml", good)
	if err := Validate(objs); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	want := []struct{ source, key string }{
		{"good.yaml#1", "Namespace//shop"},
		{"good.yaml#2", "Pod/shop/web"},
		{"good.yaml#3", "Pod/default/client"},
		{"good.yaml#4", "Service/shop/web"},
		{"good.yaml#5", "EndpointSlice/shop/web-abc"},
		{"good.yaml#6", "NetworkPolicy/shop/web"},
		{"good.yaml#7", "ShuntNetworkPolicy/shop/l7"},
		{"good.yaml#8", "HTTPRoute/shop/web"},
	}
	if len(objs) != len(want) {
		t.Fatalf("got %d objects, want %d", len(objs), len(want))
	}
	for i, w := range want {
		if objs[i].Source != w.source || objs[i].Key().String() != w.key {
			t.Errorf("object %d: %s %s, want %s %s", i, objs[i].Source, objs[i].Key(), w.source, w.key)
		}
	}

	if ns, name := objs[0].NamespaceName(); ns != "" || name != "shop" || objs[0].Kind() != "Namespace" {
		t.Errorf("namespace: %q %q %q", objs[0].Kind(), ns, name)
	}
	_ = objs[0].Obj.(*corev1.Namespace)

	pod := objs[1].Obj.(*corev1.Pod)
	if got := pod.Spec.Containers[0].Ports[0].Protocol; got != corev1.ProtocolTCP {
		t.Errorf("container port protocol %q, want TCP", got)
	}
	if got := pod.Spec.Containers[0].Args; !reflect.DeepEqual(got, []string{"--port", "8080"}) {
		t.Errorf("args %q", got)
	}
	if ns, _ := objs[2].NamespaceName(); ns != "default" {
		t.Errorf("namespace not defaulted: %q", ns)
	}

	svc := objs[3].Obj.(*corev1.Service)
	if svc.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("service type %q", svc.Spec.Type)
	}
	if got := svc.Spec.Ports[0].TargetPort; got != intstr.FromString("http") {
		t.Errorf("named targetPort changed to %v", got)
	}
	if got := svc.Spec.Ports[1].TargetPort; got != intstr.FromInt32(8080) {
		t.Errorf("targetPort %v, want defaulted to port 8080", got)
	}
	if svc.Spec.Ports[1].Protocol != corev1.ProtocolTCP {
		t.Errorf("service port protocol %q", svc.Spec.Ports[1].Protocol)
	}
	if got := *svc.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds; got != 10800 {
		t.Errorf("ClientIP timeout %d, want 10800", got)
	}

	slice := objs[4].Obj.(*discoveryv1.EndpointSlice)
	if *slice.Ports[0].Protocol != corev1.ProtocolTCP || *slice.Ports[0].Name != "" {
		t.Errorf("slice port not defaulted: %+v", slice.Ports[0])
	}

	np := objs[5].Obj.(*networkingv1.NetworkPolicy)
	if got := np.Spec.PolicyTypes; !reflect.DeepEqual(got, []networkingv1.PolicyType{"Ingress", "Egress"}) {
		t.Errorf("policyTypes %v, want [Ingress Egress]", got)
	}
	if *np.Spec.Ingress[0].Ports[0].Protocol != corev1.ProtocolTCP {
		t.Error("policy port protocol not defaulted")
	}

	snp := objs[6].Obj.(*ShuntNetworkPolicy)
	if snp.Spec.Ingress[0].Action != ActionAllow || snp.Spec.Egress[0].Action != ActionDeny {
		t.Errorf("actions %q %q", snp.Spec.Ingress[0].Action, snp.Spec.Egress[0].Action)
	}
	if h := snp.Spec.Ingress[0].HTTP[0]; h.Method != "GET" || h.Path != "/api/.*" || h.Headers["X-Team"] != "shop" {
		t.Errorf("http rule %+v", h)
	}
	if *snp.Spec.Ingress[0].Ports[0].Protocol != corev1.ProtocolTCP {
		t.Error("shunt policy port protocol not defaulted")
	}

	// The CRD's defaults: an omitted match is PathPrefix "/", a header
	// match Exact, a backendRef a core Service of weight 1; what was
	// written stays.
	route := objs[7].Obj.(*gatewayv1.HTTPRoute)
	if p := route.Spec.ParentRefs[0]; *p.Group != "" || *p.Kind != "Service" || *p.Port != 80 {
		t.Errorf("parentRef %+v", p)
	}
	pathOf := func(m gatewayv1.HTTPRouteMatch) string { return string(*m.Path.Type) + " " + *m.Path.Value }
	r0, r1, r2 := route.Spec.Rules[0], route.Spec.Rules[1], route.Spec.Rules[2]
	if got := pathOf(r0.Matches[0]); got != "PathPrefix /" || *r0.Matches[0].Headers[0].Type != gatewayv1.HeaderMatchExact {
		t.Errorf("rule 0 match not defaulted: path %s, header %+v", got, r0.Matches[0].Headers[0])
	}
	if b := r0.BackendRefs[0]; *b.Group != "" || *b.Kind != "Service" || *b.Weight != 1 {
		t.Errorf("backendRef not defaulted: %+v", b)
	}
	if got := pathOf(r1.Matches[0]); got != "RegularExpression /api/v[0-9]+/.*" || *r1.Matches[0].QueryParams[0].Type != gatewayv1.QueryParamMatchExact ||
		*r1.BackendRefs[0].Weight != 90 || *r1.BackendRefs[1].Weight != 10 {
		t.Errorf("rule 1 changed: %s %+v", got, r1)
	}
	if len(r2.Matches) != 1 || pathOf(r2.Matches[0]) != "PathPrefix /" || *r2.BackendRefs[0].Weight != 0 {
		t.Errorf("rule 2: matches %+v, weight %d; want one PathPrefix / match and weight 0 kept", r2.Matches, *r2.BackendRefs[0].Weight)
	}
}

// A route without rules, or with a parentRef naming only a name, gets
// what the API server would store: one rule matching every request, a
// Gateway parent (which Validate then refuses).
func TestHTTPRouteDefaults(t *testing.T) {
	objs := mustParse(t, "r.yaml", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec: {parentRefs: [{name: web}]}\n")
	route := objs[0].Obj.(*gatewayv1.HTTPRoute)
	if p := route.Spec.ParentRefs[0]; *p.Group != gatewayv1.GroupName || *p.Kind != "Gateway" {
		t.Errorf("parentRef %+v: want a Gateway of %s", p, gatewayv1.GroupName)
	}
	if r := route.Spec.Rules; len(r) != 1 || len(r[0].Matches) != 1 || *r[0].Matches[0].Path.Type != gatewayv1.PathMatchPathPrefix ||
		*r[0].Matches[0].Path.Value != "/" || len(r[0].BackendRefs) != 0 {
		t.Errorf("rules %+v: want one rule matching PathPrefix /", r)
	}
	assertHasError(t, Validate(objs), FieldError{"r.yaml#1", "HTTPRoute default/r", "spec.parentRefs[0].kind",
		`"Gateway" is not supported: shunt supports the GAMMA mesh pattern: parentRefs must name a Service`})
}

// The agent stores objects as JSON and parses them again: that must give
// back the same objects.
func TestReparseMarshalledObjects(t *testing.T) {
	for _, o := range mustParse(t, "good.yaml", good) {
		raw, err := json.Marshal(o.Obj)
		if err != nil {
			t.Fatal(err)
		}
		again := mustParse(t, o.Source, string(raw))
		if len(again) != 1 || !reflect.DeepEqual(again[0].Obj, o.Obj) {
			t.Errorf("%s: reparsed object differs:\n%s", o.Key(), raw)
		}
	}
}

func TestParseJSONAndList(t *testing.T) {
	jsonStream := `{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}
{"apiVersion": "v1", "kind": "List", "items": [
  {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b"}},
  {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": [{"port": 53, "protocol": "UDP"}]}}
]}`
	yamlList := `apiVersion: v1
kind: List
metadata: {}
items:
- {apiVersion: v1, kind: Namespace, metadata: {name: a}}
- apiVersion: v1
  kind: Namespace
  metadata: {name: b}
`
	flow := `{apiVersion: v1, kind: Namespace, metadata: {name: a}}` // YAML, though it starts like JSON
	for _, tc := range []struct {
		name, doc string
		want      []string
	}{
		{"json stream", jsonStream, []string{"s.json#1 Namespace//a", "s.json#2 items[0] Namespace//b", "s.json#2 items[1] Service/default/s"}},
		{"yaml list", yamlList, []string{"s.json#1 items[0] Namespace//a", "s.json#1 items[1] Namespace//b"}},
		{"yaml flow", flow, []string{"s.json#1 Namespace//a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, o := range mustParse(t, "s.json", tc.doc) {
				got = append(got, o.Source+" "+o.Key().String())
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	pod := "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    command: [x]\n"
	for _, tc := range []struct {
		name, doc string
		want      FieldError // Message is matched as a substring
	}{
		{"unknown kind", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}",
			FieldError{"x.yaml#1", "Deployment d", "kind", `unknown kind "Deployment": supported kinds are discovery.k8s.io/v1 EndpointSlice, gateway.networking.k8s.io/v1 GRPCRoute, gateway.networking.k8s.io/v1 HTTPRoute, gateway.networking.k8s.io/v1beta1 ReferenceGrant, networking.k8s.io/v1 NetworkPolicy, shunt.io/v1alpha1 ShuntNetworkPolicy, v1 Namespace, v1 Node, v1 Pod, v1 Service`}},
		{"missing kind", "apiVersion: v1\nmetadata: {name: d}",
			FieldError{"x.yaml#1", "", "kind", "required"}},
		{"wrong apiVersion", "apiVersion: networking.k8s.io/v1beta1\nkind: NetworkPolicy\nmetadata: {name: np, namespace: prod}",
			FieldError{"x.yaml#1", "NetworkPolicy prod/np", "apiVersion", `"networking.k8s.io/v1beta1" is not supported for NetworkPolicy: use "networking.k8s.io/v1"`}},
		{"missing apiVersion", "kind: Pod\nmetadata: {name: p}",
			FieldError{"x.yaml#1", "Pod default/p", "apiVersion", `required`}},
		{"unknown field", pod + "    comand: [y]\n",
			FieldError{"x.yaml#1", "Pod default/p", "spec.containers[0].comand", "unknown field"}},
		{"unknown top-level field", "apiVersion: v1\nkind: Namespace\nmetadata: {name: ns}\nspec: {}\nstatuss: {}",
			FieldError{"x.yaml#1", "Namespace ns", "statuss", "unknown field"}},
		{"YAML boolean where a string is wanted", "apiVersion: v1\nkind: Namespace\nmetadata: {name: n}",
			FieldError{"x.yaml#1", "Namespace (unnamed)", "metadata.name", "got bool, want a string (quote it"}},
		{"field names are case-sensitive", "apiVersion: v1\nkind: Namespace\nmetadata: {Name: n}",
			FieldError{"x.yaml#1", "Namespace (unnamed)", "metadata.Name", "unknown field"}},
		{"unknown field in shunt policy", "apiVersion: shunt.io/v1alpha1\nkind: ShuntNetworkPolicy\nmetadata: {name: s}\nspec: {podSelector: {}, ingress: [{peers: [{entity: host, port: 80}]}]}",
			FieldError{"x.yaml#1", "ShuntNetworkPolicy default/s", "spec.ingress[0].peers[0].port", "unknown field"}},
		{"duplicate YAML key", pod + "    name: d\n",
			FieldError{"x.yaml#1", "", "", `not valid YAML: line 8: key "name" already set in map`}},
		{"duplicate JSON field", `{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a", "name": "b"}}`,
			FieldError{"x.yaml#1", "Namespace b", "metadata.name", "duplicate field"}},
		{"wrong type", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, command: [x], ports: [{containerPort: http}]}]}",
			FieldError{"x.yaml#1", "Pod default/p", "spec.containers.ports.containerPort", "got string, want an integer"}},
		{"not a mapping", "- a\n- b\n",
			FieldError{"x.yaml#1", "", "", "must be a mapping with apiVersion and kind, not a list"}},
		{"YAML syntax error with file line", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n# second\nmetadata: [\n",
			FieldError{"x.yaml#2", "", "", "not valid YAML: line 6:"}},
		{"bad JSON after a good document", `{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}} {"kind": `,
			FieldError{"x.yaml#2", "", "", "not valid JSON"}},
		{"nested List", "apiVersion: v1\nkind: List\nitems: [{apiVersion: v1, kind: List, items: []}]",
			FieldError{"x.yaml#1 items[0]", "", "kind", "cannot contain another List"}},
		{"List item error", "apiVersion: v1\nkind: List\nitems: [{apiVersion: v1, kind: Namespace, metadata: {name: a, nme: b}}]",
			FieldError{"x.yaml#1 items[0]", "Namespace a", "metadata.nme", "unknown field"}},
		{"unknown List field", "apiVersion: v1\nkind: List\nitem: []",
			FieldError{"x.yaml#1", "List", "item", "unknown field"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("x.yaml", []byte(tc.doc))
			assertHasError(t, err, tc.want)
		})
	}
}

// Parse reports every broken document, not just the first.
func TestParseReportsEveryDocument(t *testing.T) {
	doc := "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, x: 1}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: ok}\n---\nkind: Job\n"
	_, err := Parse("x.yaml", []byte(doc))
	var errs *Errors
	if !errors.As(err, &errs) || len(errs.List) != 2 {
		t.Fatalf("want 2 problems, got %v", err)
	}
	if errs.List[0].Source != "x.yaml#1" || errs.List[1].Source != "x.yaml#3" {
		t.Errorf("sources %q %q", errs.List[0].Source, errs.List[1].Source)
	}
}

// A document that reaches Decode without its object (an API request naming
// a source but no object) is refused by name, not a panic.
func TestDecodeDocumentWithoutObject(t *testing.T) {
	for _, tc := range []struct{ json, kind string }{{"", "an empty document"}, {"  ", "an empty document"}, {"null", "null"}} {
		_, err := Decode([]Document{{Source: "req#1", JSON: []byte(tc.json)}})
		assertHasError(t, err, FieldError{"req#1", "", "", "must be a mapping with apiVersion and kind, not " + tc.kind})
	}
}

func TestEmptyStream(t *testing.T) {
	for _, doc := range []string{"", "\n", "# nothing\n", "---\n---\n", "null\n"} {
		if objs := mustParse(t, "e.yaml", doc); len(objs) != 0 {
			t.Errorf("%q: got %d objects", doc, len(objs))
		}
	}
}

func TestObjectBuiltInCode(t *testing.T) {
	// No TypeMeta: Kind and Key still work, from the Go type.
	o := Object{Source: "code", Obj: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "prod"}}}
	if o.Kind() != "Namespace" || o.Key().String() != "Namespace//prod" {
		t.Errorf("kind %q key %q", o.Kind(), o.Key())
	}
	if err := Validate([]Object{o}); err != nil {
		t.Error(err)
	}
}

func TestShuntPolicyDeepCopy(t *testing.T) {
	objs := mustParse(t, "good.yaml", good)
	orig := objs[6].Obj.(*ShuntNetworkPolicy)
	cp := orig.DeepCopyObject().(*ShuntNetworkPolicy)
	if !reflect.DeepEqual(cp, orig) {
		t.Fatalf("copy differs:\n%+v\n%+v", cp, orig)
	}
	cp.Spec.Ingress[0].HTTP[0].Headers["X-Team"] = "other"
	cp.Spec.Ingress[0].Peers[1].Except[0] = "fd00::/96"
	cp.Spec.Egress[0].Peers[0].PodSelector.MatchLabels["app"] = "other"
	cp.Labels = map[string]string{"x": "y"}
	if orig.Spec.Ingress[0].HTTP[0].Headers["X-Team"] != "shop" || orig.Spec.Ingress[0].Peers[1].Except[0] != "fd00::/80" ||
		orig.Spec.Egress[0].Peers[0].PodSelector.MatchLabels["app"] != "db" || orig.Labels != nil {
		t.Error("copy shares memory with the original")
	}
	if (*ShuntNetworkPolicy)(nil).DeepCopyObject() != nil {
		t.Error("nil copy is not nil")
	}
}

// assertHasError checks that err is a *Errors holding a problem with
// want's Source, Object and Field whose message contains want.Message.
func assertHasError(t *testing.T, err error, want FieldError) {
	t.Helper()
	var errs *Errors
	if !errors.As(err, &errs) {
		t.Fatalf("got %v (%T), want *Errors with %q", err, err, want.Error())
	}
	for _, fe := range errs.List {
		if fe.Source == want.Source && fe.Object == want.Object && fe.Field == want.Field && strings.Contains(fe.Message, want.Message) {
			return
		}
	}
	t.Errorf("got:\n%v\nwant a line like:\n%v", err, want.Error())
}

// A GRPCRoute of a Service parent: defaults as the CRD's, method matches
// checked as the CRD checks them, the rest as an HTTPRoute's.
func TestGRPCRoute(t *testing.T) {
	const good = `apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: g, namespace: mesh}
spec:
  parentRefs: [{group: "", kind: Service, name: echo, port: 7070}]
  rules:
  - matches:
    - method: {service: echo.Echo, method: Echo}
      headers: [{name: x-version, value: "2"}]
    - method: {type: RegularExpression, method: "Ec.*"}
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-a, value: b}]}
    backendRefs: [{name: echo-v1, port: 7070, weight: 70}, {name: echo-v2, port: 7070}]
`
	objs := mustParse(t, "g.yaml", good)
	if err := Validate(objs); err != nil {
		t.Fatalf("valid GRPCRoute refused: %v", err)
	}
	if k := objs[0].Key(); k != (Key{KindGRPCRoute, "mesh", "g"}) {
		t.Errorf("key %v", k)
	}
	g := objs[0].Obj.(*gatewayv1.GRPCRoute)
	rule := g.Spec.Rules[0]
	if *rule.Matches[0].Method.Type != gatewayv1.GRPCMethodMatchExact || *rule.Matches[0].Headers[0].Type != gatewayv1.GRPCHeaderMatchExact {
		t.Errorf("match types not defaulted to Exact: %+v", rule.Matches[0])
	}
	if b := rule.BackendRefs[1]; *b.Weight != 1 || *b.Kind != KindService || *b.Group != "" {
		t.Errorf("backendRef defaults %+v", b.BackendRef)
	}

	for _, c := range []struct{ replace, with, field, message string }{
		{"method: {service: echo.Echo, method: Echo}", "method: {type: Exact}", "spec.rules[0].matches[0].method", "one or both of service and method"},
		{"method: {service: echo.Echo, method: Echo}", "method: {service: echo/Echo}", "spec.rules[0].matches[0].method.service", `"echo/Echo": a service must match`},
		{`method: "Ec.*"`, `method: "Ec("`, "spec.rules[0].matches[1].method.method", "not a valid RE2 regular expression"},
		{"name: x-version", `name: "x version"`, "spec.rules[0].matches[0].headers[0].name", "not a valid header name"},
		{"type: RequestHeaderModifier\n      requestHeaderModifier: {set: [{name: x-a, value: b}]}", "type: ExtensionRef\n      extensionRef: {group: example.com, kind: Limit, name: x}", "spec.rules[0].filters[0].type", "ExtensionRef"},
		{"kind: Service, name: echo", "kind: Gateway, name: echo", "spec.parentRefs[0].kind", "GAMMA"},
		{"  rules:", "  hostnames: [echo.example]\n  rules:", "spec.hostnames", "not supported"},
	} {
		doc := strings.Replace(good, c.replace, c.with, 1)
		assertHasError(t, Validate(mustParse(t, "g.yaml", doc)), FieldError{"g.yaml#1", "GRPCRoute mesh/g", c.field, c.message})
	}
}
