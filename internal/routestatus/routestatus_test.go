package routestatus

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

// A consumer route (GAMMA: its parent Service is of another namespace)
// is accepted by that Service, and its backendRefs resolve in the
// namespaces they name.
func TestConsumerRouteParentAndBackendNamespaces(t *testing.T) {
	svc := func(ns, name string) manifest.Object {
		return manifest.Object{Obj: &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}}
	}
	s := model.NewStore([]manifest.Object{svc("producer", "echo")})
	kind, producer := gatewayv1.Kind("Service"), gatewayv1.Namespace("producer")
	port := gatewayv1.PortNumber(80)
	ref := func(name string, ns *gatewayv1.Namespace) gatewayv1.HTTPBackendRef {
		return gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: gatewayv1.ObjectName(name), Namespace: ns, Port: &port}}}
	}
	rt := &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "consumer", Name: "r"},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Kind: &kind, Name: "echo", Namespace: &producer}}},
			Rules:           []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{ref("echo", &producer)}}},
		}}
	st := Compute(s, rt, "shunt.io/mesh", metav1.Now())
	conds := st.Parents[0].Conditions
	if c := meta.FindStatusCondition(conds, string(gatewayv1.RouteConditionAccepted)); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Accepted: %+v, want True", c)
	}
	if c := meta.FindStatusCondition(conds, string(gatewayv1.RouteConditionResolvedRefs)); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("ResolvedRefs: %+v, want True", c)
	}

	// The same names without the namespace are looked up in the route's.
	rt.Spec.ParentRefs[0].Namespace = nil
	rt.Spec.Rules[0].BackendRefs[0] = ref("echo", nil)
	conds = Compute(s, rt, "shunt.io/mesh", metav1.Now()).Parents[0].Conditions
	if c := meta.FindStatusCondition(conds, string(gatewayv1.RouteConditionAccepted)); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("Accepted for consumer/echo: %+v, want False", c)
	}
	if c := meta.FindStatusCondition(conds, string(gatewayv1.RouteConditionResolvedRefs)); c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "not found") {
		t.Errorf("ResolvedRefs for consumer/echo: %+v, want False, not found", c)
	}
}

// A GRPCRoute gets the status an HTTPRoute would; where an older HTTPRoute
// holds its Service port, its Accepted is False (RouteConflict) naming it,
// while its other parent is accepted.
func TestGRPCRouteStatusAndConflict(t *testing.T) {
	svc := func(name string) manifest.Object {
		return manifest.Object{Obj: &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "mesh", Name: name},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{{Port: 7070, Protocol: corev1.ProtocolTCP}}}}}
	}
	kind, port := gatewayv1.Kind("Service"), gatewayv1.PortNumber(7070)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "mesh", Name: "h", CreationTimestamp: metav1.NewTime(t0)},
		Spec: gatewayv1.HTTPRouteSpec{CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Kind: &kind, Name: "echo"}}}}}
	g := &gatewayv1.GRPCRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "mesh", Name: "g", Generation: 2, CreationTimestamp: metav1.NewTime(t0.Add(time.Second))},
		Spec: gatewayv1.GRPCRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Kind: &kind, Name: "echo", Port: &port}, {Kind: &kind, Name: "other", Port: &port}}},
			Rules: []gatewayv1.GRPCRouteRule{{BackendRefs: []gatewayv1.GRPCBackendRef{
				{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "echo-v1", Port: &port}}},
				{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "gone", Port: &port}}},
			}}},
		}}
	s := model.NewStore([]manifest.Object{svc("echo"), svc("other"), svc("echo-v1"), {Obj: h}, {Obj: g}})
	st := ComputeGRPC(s, g, "shunt.io/mesh", metav1.Now())
	if len(st.Parents) != 2 {
		t.Fatalf("parents %+v, want 2", st.Parents)
	}
	held := meta.FindStatusCondition(st.Parents[0].Conditions, string(gatewayv1.RouteConditionAccepted))
	if held == nil || held.Status != metav1.ConditionFalse || held.Reason != ReasonRouteConflict || !strings.Contains(held.Message, "HTTPRoute mesh/h") || held.ObservedGeneration != 2 {
		t.Errorf("Accepted on echo: %+v, want False, RouteConflict, naming HTTPRoute mesh/h", held)
	}
	if c := meta.FindStatusCondition(st.Parents[1].Conditions, string(gatewayv1.RouteConditionAccepted)); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Accepted on other: %+v, want True", c)
	}
	if c := meta.FindStatusCondition(st.Parents[1].Conditions, string(gatewayv1.RouteConditionResolvedRefs)); c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "gone:7070: Service gone not found") {
		t.Errorf("ResolvedRefs: %+v, want False naming gone:7070", c)
	}
	// The older HTTPRoute stays accepted.
	if c := meta.FindStatusCondition(Compute(s, h, "shunt.io/mesh", metav1.Now()).Parents[0].Conditions, string(gatewayv1.RouteConditionAccepted)); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("the HTTPRoute's Accepted: %+v, want True", c)
	}
}

// A rule whose filter holds a control byte (the standard CRD allows a CR
// LF in a header value) is answered 500 by the proxy: the route says so,
// PartiallyInvalid naming the rule and field while other rules serve,
// Accepted False (UnsupportedValue) once every rule is; the condition goes
// when the value is mended.
func TestInvalidFilterTextStatus(t *testing.T) {
	s := model.NewStore([]manifest.Object{{Obj: &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "echo"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}}})
	kind := gatewayv1.Kind("Service")
	header := func(value string) []gatewayv1.HTTPRouteFilter {
		return []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier,
			RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{Set: []gatewayv1.HTTPHeader{{Name: "X-Tag", Value: value}}}}}
	}
	rt := &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "r", Generation: 2},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Kind: &kind, Name: "echo"}}},
			Rules:           []gatewayv1.HTTPRouteRule{{Filters: header("ok")}, {Filters: header("a\r\nX-Evil: 1")}},
		}}
	conds := Compute(s, rt, "shunt.io/mesh", metav1.Now()).Parents[0].Conditions
	if c := meta.FindStatusCondition(conds, string(gatewayv1.RouteConditionAccepted)); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Accepted with one rule of two invalid: %+v, want True", c)
	}
	c := meta.FindStatusCondition(conds, string(gatewayv1.RouteConditionPartiallyInvalid))
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != string(gatewayv1.RouteReasonUnsupportedValue) || c.ObservedGeneration != 2 ||
		!strings.HasPrefix(c.Message, "Dropped Rule(s) 1:") || !strings.Contains(c.Message, "rules[1].filters[0] (RequestHeaderModifier).set[0].value") || !strings.Contains(c.Message, "CR") {
		t.Errorf("PartiallyInvalid: %+v, want True, UnsupportedValue, Dropped Rule(s) 1 naming the field and the CR", c)
	}

	rt.Spec.Rules[0].Filters = header("\x00")
	rt.Status.Parents = []gatewayv1.RouteParentStatus{{ParentRef: rt.Spec.ParentRefs[0], ControllerName: "shunt.io/mesh", Conditions: conds}}
	conds = Compute(s, rt, "shunt.io/mesh", metav1.Now()).Parents[0].Conditions
	if c := meta.FindStatusCondition(conds, string(gatewayv1.RouteConditionAccepted)); c == nil || c.Status != metav1.ConditionFalse ||
		c.Reason != string(gatewayv1.RouteReasonUnsupportedValue) || !strings.Contains(c.Message, "NUL") {
		t.Errorf("Accepted with every rule invalid: %+v, want False, UnsupportedValue, naming the NUL", c)
	}
	if c := meta.FindStatusCondition(conds, string(gatewayv1.RouteConditionPartiallyInvalid)); c != nil {
		t.Errorf("PartiallyInvalid with every rule invalid: %+v, want none", c)
	}

	rt.Spec.Rules[0].Filters, rt.Spec.Rules[1].Filters = header("a\tb"), header("fine")
	rt.Status.Parents[0].Conditions = conds
	conds = Compute(s, rt, "shunt.io/mesh", metav1.Now()).Parents[0].Conditions
	if c := meta.FindStatusCondition(conds, string(gatewayv1.RouteConditionAccepted)); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Accepted once mended: %+v, want True", c)
	}
	if c := meta.FindStatusCondition(conds, string(gatewayv1.RouteConditionPartiallyInvalid)); c != nil {
		t.Errorf("PartiallyInvalid once mended: %+v, want none", c)
	}
}

// A backendRef to a Service of another namespace (not the route's parent)
// resolves only where a ReferenceGrant of that namespace permits the
// route's kind and namespace: without one ResolvedRefs is False,
// RefNotPermitted; a grant for another namespace, another kind or another
// Service changes nothing; a grant naming this one, or all Services, does.
func TestCrossNamespaceBackendNeedsReferenceGrant(t *testing.T) {
	objs := []manifest.Object{
		{Obj: &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}},
		{Obj: &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "front"},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.11", Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}},
	}
	kind, shop, port := gatewayv1.Kind("Service"), gatewayv1.Namespace("shop"), gatewayv1.PortNumber(80)
	rt := &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "r"},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Kind: &kind, Name: "front"}}},
			Rules: []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{
				BackendObjectReference: gatewayv1.BackendObjectReference{Name: "web", Namespace: &shop, Port: &port}}}}}},
		}}
	grant := func(fromNS, fromKind string, to *gatewayv1.ObjectName) manifest.Object {
		return manifest.Object{Obj: &gatewayv1beta1.ReferenceGrant{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "g"},
			Spec: gatewayv1beta1.ReferenceGrantSpec{
				From: []gatewayv1beta1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: gatewayv1.Kind(fromKind), Namespace: gatewayv1.Namespace(fromNS)}},
				To:   []gatewayv1beta1.ReferenceGrantTo{{Group: "", Kind: "Service", Name: to}},
			}}}
	}
	web, other := gatewayv1.ObjectName("web"), gatewayv1.ObjectName("other")
	for _, c := range []struct {
		name  string
		grant *manifest.Object
		want  metav1.ConditionStatus
	}{
		{"no grant", nil, metav1.ConditionFalse},
		{"a grant to another namespace's routes", ptr(grant("elsewhere", "HTTPRoute", nil)), metav1.ConditionFalse},
		{"a grant to GRPCRoutes", ptr(grant("default", "GRPCRoute", nil)), metav1.ConditionFalse},
		{"a grant of another Service", ptr(grant("default", "HTTPRoute", &other)), metav1.ConditionFalse},
		{"a grant of this Service", ptr(grant("default", "HTTPRoute", &web)), metav1.ConditionTrue},
		{"a grant of every Service", ptr(grant("default", "HTTPRoute", nil)), metav1.ConditionTrue},
	} {
		in := objs
		if c.grant != nil {
			in = append(append([]manifest.Object{}, objs...), *c.grant)
		}
		conds := Compute(model.NewStore(in), rt, "shunt.io/mesh", metav1.Now()).Parents[0].Conditions
		got := meta.FindStatusCondition(conds, string(gatewayv1.RouteConditionResolvedRefs))
		if got == nil || got.Status != c.want {
			t.Errorf("%s: ResolvedRefs %+v, want %s", c.name, got, c.want)
			continue
		}
		if c.want == metav1.ConditionFalse && (got.Reason != string(gatewayv1.RouteReasonRefNotPermitted) || !strings.Contains(got.Message, "shop/web:80: no ReferenceGrant of namespace shop")) {
			t.Errorf("%s: ResolvedRefs %s: %s; want RefNotPermitted naming shop/web:80", c.name, got.Reason, got.Message)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// A route attached to a Gateway (north-south, another implementation's)
// as well as to a Service gets a status entry for the Service only; one
// attached to Gateways only gets none, so shunt never answers for another
// controller's parents (and its writer removes an entry it wrote before).
func TestGatewayParentsAreNotShunts(t *testing.T) {
	s := model.NewStore([]manifest.Object{{Obj: &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.20", Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}}})
	gwGroup, gwKind := gatewayv1.Group(gatewayv1.GroupName), gatewayv1.Kind("Gateway")
	svcKind, core := gatewayv1.Kind("Service"), gatewayv1.Group("")
	gateway := gatewayv1.ParentReference{Group: &gwGroup, Kind: &gwKind, Name: "public"}
	service := gatewayv1.ParentReference{Group: &core, Kind: &svcKind, Name: "cart"}
	rt := &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "r"},
		Spec: gatewayv1.HTTPRouteSpec{CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{gateway, service}}}}
	st := Compute(s, rt, "shunt.io/mesh", metav1.Now())
	if len(st.Parents) != 1 || st.Parents[0].ParentRef.Name != "cart" {
		t.Fatalf("parents %+v; want the Service cart's alone", st.Parents)
	}
	if c := meta.FindStatusCondition(st.Parents[0].Conditions, string(gatewayv1.RouteConditionAccepted)); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Accepted for cart: %+v, want True", c)
	}
	rt.Spec.ParentRefs = rt.Spec.ParentRefs[:1]
	if st := Compute(s, rt, "shunt.io/mesh", metav1.Now()); len(st.Parents) != 0 {
		t.Errorf("a route attached to a Gateway only: parents %+v; want none of shunt's", st.Parents)
	}
	// With the defaults (group and kind omitted) a parentRef is a Gateway too.
	rt.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "public"}}
	if st := Compute(s, rt, "shunt.io/mesh", metav1.Now()); len(st.Parents) != 0 {
		t.Errorf("a parentRef with no kind (a Gateway): parents %+v; want none", st.Parents)
	}
}

// A RequestMirror's Service is resolved as a backendRef's: one that does
// not exist makes ResolvedRefs False and is named.
func TestMirrorRefsResolve(t *testing.T) {
	s := model.NewStore([]manifest.Object{{Obj: &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}}})
	kind, port := gatewayv1.Kind("Service"), gatewayv1.PortNumber(80)
	ref := gatewayv1.BackendObjectReference{Name: "web", Port: &port}
	mirror := func(name gatewayv1.ObjectName) gatewayv1.HTTPRouteFilter {
		return gatewayv1.HTTPRouteFilter{Type: gatewayv1.HTTPRouteFilterRequestMirror,
			RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{BackendRef: gatewayv1.BackendObjectReference{Name: name, Port: &port}}}
	}
	rt := &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "r"},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Kind: &kind, Name: "web"}}},
			Rules: []gatewayv1.HTTPRouteRule{{Filters: []gatewayv1.HTTPRouteFilter{mirror("web")},
				BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{BackendObjectReference: ref}}}}},
		}}
	resolved := func() *metav1.Condition {
		return meta.FindStatusCondition(Compute(s, rt, "shunt.io/mesh", metav1.Now()).Parents[0].Conditions, string(gatewayv1.RouteConditionResolvedRefs))
	}
	if c := resolved(); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("ResolvedRefs with a mirror to an existing Service: %+v, want True", c)
	}
	rt.Spec.Rules[0].Filters = append(rt.Spec.Rules[0].Filters, mirror("shadow"))
	if c := resolved(); c == nil || c.Status != metav1.ConditionFalse || c.Reason != string(gatewayv1.RouteReasonBackendNotFound) ||
		!strings.Contains(c.Message, "shadow:80: Service shadow not found") {
		t.Errorf("ResolvedRefs with a mirror to a missing Service: %+v, want False naming shadow:80", c)
	}
}
