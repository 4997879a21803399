// Package routestatus computes the status a GAMMA (service mesh)
// implementation writes on an HTTPRoute or a GRPCRoute attached to Services: one
// RouteParentStatus per Service parentRef (a Gateway parent gets none from
// shunt: its implementation writes it) with two conditions, Accepted (the parent
// Service exists, has a ClusterIP and the port named) and ResolvedRefs
// (every backendRef names a port of an existing Service), and
// PartiallyInvalid while some rules hold a match or a filter the proxy
// cannot apply (l7.InvalidRules; Accepted is False when every rule does). The
// lab's API server and the agent on a Kubernetes node both write it.
package routestatus

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/shuntnet/shunt/internal/l7"
	"github.com/shuntnet/shunt/internal/meshroute"
	"github.com/shuntnet/shunt/internal/model"
)

// A View computes routes' statuses as of one state of the cluster. What
// every route's status depends on, the ReferenceGrants and the conflicts
// between routes of both kinds (a walk of every route), is worked out once
// for all the routes of a pass, not once per route.
type View struct {
	s         *model.Store
	grants    meshroute.Grants
	conflicts meshroute.Conflicts
}

// Of is the view of s.
func Of(s *model.Store) *View {
	return &View{
		s:         s,
		grants:    meshroute.NewGrants(s.ReferenceGrants()),
		conflicts: meshroute.Conflicting(meshroute.Routes(s.HTTPRoutes(), s.GRPCRoutes())),
	}
}

// Compute is the route's status, for the parents controller implements.
// Conditions whose status stays keep their lastTransitionTime; those that
// change get now.
func (v *View) Compute(rt *gatewayv1.HTTPRoute, controller gatewayv1.GatewayController, now metav1.Time) gatewayv1.HTTPRouteStatus {
	return gatewayv1.HTTPRouteStatus{RouteStatus: v.compute(meshroute.Route{Kind: meshroute.KindHTTPRoute, HTTPRoute: rt}, controller, now)}
}

// ComputeGRPC is a GRPCRoute's status: the same conditions, of its HTTPRoute
// form (meshroute.HTTPForm).
func (v *View) ComputeGRPC(g *gatewayv1.GRPCRoute, controller gatewayv1.GatewayController, now metav1.Time) gatewayv1.GRPCRouteStatus {
	return gatewayv1.GRPCRouteStatus{RouteStatus: v.compute(meshroute.Route{Kind: meshroute.KindGRPCRoute, HTTPRoute: meshroute.HTTPForm(g)}, controller, now)}
}

// Compute is one HTTPRoute's status as of s (Of(s).Compute).
func Compute(s *model.Store, rt *gatewayv1.HTTPRoute, controller gatewayv1.GatewayController, now metav1.Time) gatewayv1.HTTPRouteStatus {
	return Of(s).Compute(rt, controller, now)
}

// ComputeGRPC is one GRPCRoute's status as of s (Of(s).ComputeGRPC).
func ComputeGRPC(s *model.Store, g *gatewayv1.GRPCRoute, controller gatewayv1.GatewayController, now metav1.Time) gatewayv1.GRPCRouteStatus {
	return Of(s).ComputeGRPC(g, controller, now)
}

// ReasonRouteConflict is the reason of Accepted False on a parent that a
// route of the other kind (HTTPRoute, GRPCRoute) holds: the Gateway API
// names none for routes, and this is the one its listeners use.
const ReasonRouteConflict = "RouteConflict"

func (v *View) compute(mr meshroute.Route, controller gatewayv1.GatewayController, now metav1.Time) gatewayv1.RouteStatus {
	rt := mr.HTTPRoute
	resolved := v.resolvedRefs(mr.Kind, rt, now)
	invalid, problems := l7.InvalidRules(rt)
	var st gatewayv1.RouteStatus
	for i, pr := range rt.Spec.ParentRefs {
		// A Gateway parent (north-south) is another implementation's to
		// answer for: the Gateway API has each write status only for the
		// parents it is responsible for, and shunt's are Services.
		if !meshroute.IsService(pr.Group, pr.Kind) {
			continue
		}
		var conds []metav1.Condition
		for _, prev := range rt.Status.Parents {
			if prev.ControllerName == controller && reflect.DeepEqual(prev.ParentRef, pr) {
				conds = slices.Clone(prev.Conditions) // the old route keeps its own
			}
		}
		acc := accepted(v.s, rt, pr, now)
		if why := v.conflicts.Rejected(mr, i); why != "" && acc.Status == metav1.ConditionTrue {
			acc.Status, acc.Reason, acc.Message = metav1.ConditionFalse, ReasonRouteConflict, why
		}
		partly := acc.Status == metav1.ConditionTrue && len(invalid) > 0 && len(invalid) < len(rt.Spec.Rules)
		if acc.Status == metav1.ConditionTrue && len(invalid) > 0 && !partly {
			acc.Status, acc.Reason = metav1.ConditionFalse, string(gatewayv1.RouteReasonUnsupportedValue)
			acc.Message = "every rule has a match the proxy cannot compile (the rule matches nothing) or a filter it will not apply (its requests are answered 500): " + strings.Join(problems, "; ")
		}
		meta.SetStatusCondition(&conds, acc)
		meta.SetStatusCondition(&conds, resolved)
		// Set only while True, as the Gateway API asks; the rules are
		// "dropped": their requests are answered 500.
		if partly {
			meta.SetStatusCondition(&conds, metav1.Condition{
				Type: string(gatewayv1.RouteConditionPartiallyInvalid), Status: metav1.ConditionTrue,
				Reason: string(gatewayv1.RouteReasonUnsupportedValue), ObservedGeneration: rt.Generation, LastTransitionTime: now,
				Message: fmt.Sprintf("Dropped Rule(s) %s: a match the proxy cannot compile (the rule matches nothing) or a filter it "+
					"will not apply (the rule's requests, a backendRef's filter: its share, are answered 500): %s", joinInts(invalid), strings.Join(problems, "; ")),
			})
		} else {
			meta.RemoveStatusCondition(&conds, string(gatewayv1.RouteConditionPartiallyInvalid))
		}
		st.Parents = append(st.Parents, gatewayv1.RouteParentStatus{
			ParentRef: *pr.DeepCopy(), ControllerName: controller, Conditions: conds,
		})
	}
	return st
}

// accepted is the Accepted condition for one parent: its Service must take
// connections at a ClusterIP, on the port named if one is.
func accepted(s *model.Store, rt *gatewayv1.HTTPRoute, pr gatewayv1.ParentReference, now metav1.Time) metav1.Condition {
	c := metav1.Condition{
		Type: string(gatewayv1.RouteConditionAccepted), Status: metav1.ConditionFalse,
		Reason: string(gatewayv1.RouteReasonNoMatchingParent), ObservedGeneration: rt.Generation, LastTransitionTime: now,
	}
	// A parentRef of another namespace is a consumer route's (GAMMA).
	svc, ok := s.Service(meshroute.ParentNamespace(rt, pr), string(pr.Name))
	switch {
	case !ok:
		c.Message = fmt.Sprintf("Service %s not found", pr.Name)
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		c.Message = fmt.Sprintf("Service %s is headless: a route takes the requests sent to a ClusterIP", pr.Name)
	case pr.Port != nil && !hasTCPPort(svc, *pr.Port):
		c.Message = fmt.Sprintf("Service %s has no TCP port %d", pr.Name, *pr.Port)
	default:
		c.Status, c.Reason = metav1.ConditionTrue, string(gatewayv1.RouteReasonAccepted)
		c.Message = fmt.Sprintf("attached to Service %s", pr.Name)
	}
	return c
}

// resolvedRefs is the ResolvedRefs condition of a route of kind: False,
// naming each backendRef (or mirror's) that does not resolve, when any
// does not (its share of requests is answered with 500; a mirror is
// dropped). The reason is RefNotPermitted
// when a ref to another namespace has no ReferenceGrant, else
// BackendNotFound.
func (v *View) resolvedRefs(kind string, rt *gatewayv1.HTTPRoute, now metav1.Time) metav1.Condition {
	c := metav1.Condition{
		Type: string(gatewayv1.RouteConditionResolvedRefs), Status: metav1.ConditionTrue,
		Reason: string(gatewayv1.RouteReasonResolvedRefs), Message: "every backendRef names a Service port",
		ObservedGeneration: rt.Generation, LastTransitionTime: now,
	}
	var missing []string
	notPermitted := false
	seen := map[string]bool{}
	for _, rule := range rt.Spec.Rules {
		for _, b := range refsOf(rule) {
			var port gatewayv1.PortNumber
			if b.Port != nil {
				port = *b.Port
			}
			ns := meshroute.RefNamespace(rt, b.Namespace)
			ref := fmt.Sprintf("%s:%d", b.Name, port)
			if ns != rt.Namespace {
				ref = ns + "/" + ref
			}
			if seen[ref] {
				continue
			}
			seen[ref] = true
			svc, ok := v.s.Service(ns, string(b.Name))
			switch {
			case !v.grants.PermitsService(kind, rt, ns, string(b.Name)):
				notPermitted = true
				missing = append(missing, fmt.Sprintf("%s: no ReferenceGrant of namespace %s permits %ss of %s to refer to its Services", ref, ns, kind, rt.Namespace))
			case !ok:
				missing = append(missing, fmt.Sprintf("%s: Service %s not found", ref, b.Name))
			case svc.Spec.ClusterIP == corev1.ClusterIPNone:
				missing = append(missing, fmt.Sprintf("%s: Service %s is headless (no ClusterIP to balance over)", ref, b.Name))
			case !hasTCPPort(svc, port):
				missing = append(missing, fmt.Sprintf("%s: Service %s has no TCP port %d", ref, b.Name, port))
			}
		}
	}
	if len(missing) > 0 {
		c.Status, c.Reason = metav1.ConditionFalse, string(gatewayv1.RouteReasonBackendNotFound)
		if notPermitted {
			c.Reason = string(gatewayv1.RouteReasonRefNotPermitted)
		}
		c.Message = "backendRefs not resolved: " + strings.Join(missing, "; ")
	}
	return c
}

// refsOf lists the Services a rule sends requests to: its backendRefs
// and its RequestMirror filters' (a mirror that does not resolve is
// dropped, and ResolvedRefs says so as for a backendRef).
func refsOf(rule gatewayv1.HTTPRouteRule) []gatewayv1.BackendObjectReference {
	var refs []gatewayv1.BackendObjectReference
	for _, b := range rule.BackendRefs {
		refs = append(refs, b.BackendObjectReference)
	}
	for _, f := range rule.Filters {
		if f.Type == gatewayv1.HTTPRouteFilterRequestMirror && f.RequestMirror != nil {
			refs = append(refs, f.RequestMirror.BackendRef)
		}
	}
	return refs
}

func hasTCPPort(svc *corev1.Service, port gatewayv1.PortNumber) bool {
	return slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
		return p.Port == port && p.Protocol == corev1.ProtocolTCP
	})
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}
