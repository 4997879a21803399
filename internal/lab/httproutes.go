package lab

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

// The lab's mesh controller: it writes the status of HTTPRoutes as a GAMMA
// implementation does, one RouteParentStatus per parentRef with two
// conditions: Accepted (the parent Service exists, has a ClusterIP and the
// port named) and ResolvedRefs (every backendRef names a port of an
// existing Service). A route's status is recomputed when the route or a
// Service it names changes, in the same transaction, so a Service applied
// after its route turns the route's conditions True, and deleting one
// turns them False: routes never hold Services back.

// routeController names the lab in the status it writes.
const routeController gatewayv1.GatewayController = "shunt.io/lab"

// routeStatusChanges returns the routes whose status changes alter, with
// their new status.
func routeStatusChanges(next *model.Store, changes []model.Change) []manifest.Object {
	touched := map[manifest.Key]bool{}
	servicesIn := map[string]map[gatewayv1.ObjectName]bool{} // namespace -> changed Services
	for _, c := range changes {
		if !c.Changed() {
			continue
		}
		switch c.Key.Kind {
		case manifest.KindHTTPRoute:
			touched[c.Key] = true
		case manifest.KindService:
			if servicesIn[c.Key.Namespace] == nil {
				servicesIn[c.Key.Namespace] = map[gatewayv1.ObjectName]bool{}
			}
			servicesIn[c.Key.Namespace][gatewayv1.ObjectName(c.Key.Name)] = true
		}
	}
	// A route names only Services of its own namespace (admission).
	for ns, names := range servicesIn {
		for _, rt := range next.HTTPRoutesIn(ns) {
			if slices.ContainsFunc(serviceNames(rt), func(n gatewayv1.ObjectName) bool { return names[n] }) {
				touched[manifest.Key{Kind: manifest.KindHTTPRoute, Namespace: rt.Namespace, Name: rt.Name}] = true
			}
		}
	}
	now := metav1.Now()
	var out []manifest.Object
	for _, key := range slices.SortedFunc(maps.Keys(touched), manifest.Key.Compare) {
		o, ok := next.Get(key)
		if !ok {
			continue // deleted
		}
		rt := o.Obj.(*gatewayv1.HTTPRoute)
		st := routeStatus(next, rt, now)
		if reflect.DeepEqual(st, rt.Status) {
			continue
		}
		// The stored route is shared with the published store: write a copy.
		updated := rt.DeepCopy()
		updated.Status = st
		// The route keeps its source: it is still the manifest's object.
		out = append(out, manifest.Object{Source: o.Source, Obj: updated})
	}
	return out
}

// serviceNames lists the Services a route names, parents and backends.
func serviceNames(rt *gatewayv1.HTTPRoute) []gatewayv1.ObjectName {
	var names []gatewayv1.ObjectName
	for _, p := range rt.Spec.ParentRefs {
		names = append(names, p.Name)
	}
	for _, rule := range rt.Spec.Rules {
		for _, b := range rule.BackendRefs {
			names = append(names, b.Name)
		}
	}
	return names
}

// routeStatus is the route's status as of s. Conditions whose status stays
// keep their lastTransitionTime; those that change get now.
func routeStatus(s *model.Store, rt *gatewayv1.HTTPRoute, now metav1.Time) gatewayv1.HTTPRouteStatus {
	resolved := resolvedRefs(s, rt, now)
	var st gatewayv1.HTTPRouteStatus
	for _, pr := range rt.Spec.ParentRefs {
		var conds []metav1.Condition
		for _, prev := range rt.Status.Parents {
			if prev.ControllerName == routeController && reflect.DeepEqual(prev.ParentRef, pr) {
				conds = slices.Clone(prev.Conditions) // the old route keeps its own
			}
		}
		meta.SetStatusCondition(&conds, accepted(s, rt, pr, now))
		meta.SetStatusCondition(&conds, resolved)
		st.Parents = append(st.Parents, gatewayv1.RouteParentStatus{
			ParentRef: *pr.DeepCopy(), ControllerName: routeController, Conditions: conds,
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
	svc, ok := s.Service(rt.Namespace, string(pr.Name))
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

// resolvedRefs is the ResolvedRefs condition of a route: False, naming
// each backendRef that does not resolve, when any does not (its share of
// requests is answered with 500).
func resolvedRefs(s *model.Store, rt *gatewayv1.HTTPRoute, now metav1.Time) metav1.Condition {
	c := metav1.Condition{
		Type: string(gatewayv1.RouteConditionResolvedRefs), Status: metav1.ConditionTrue,
		Reason: string(gatewayv1.RouteReasonResolvedRefs), Message: "every backendRef names a Service port",
		ObservedGeneration: rt.Generation, LastTransitionTime: now,
	}
	var missing []string
	seen := map[string]bool{}
	for _, rule := range rt.Spec.Rules {
		for _, b := range rule.BackendRefs {
			var port gatewayv1.PortNumber
			if b.Port != nil {
				port = *b.Port
			}
			ref := fmt.Sprintf("%s:%d", b.Name, port)
			if seen[ref] {
				continue
			}
			seen[ref] = true
			svc, ok := s.Service(rt.Namespace, string(b.Name))
			switch {
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
		c.Message = "backendRefs not resolved: " + strings.Join(missing, "; ")
	}
	return c
}

func hasTCPPort(svc *corev1.Service, port gatewayv1.PortNumber) bool {
	return slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
		return p.Port == port && p.Protocol == corev1.ProtocolTCP
	})
}
