package lab

import (
	"maps"
	"reflect"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/routestatus"
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
		st := routestatus.Compute(next, rt, routeController, now)
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
