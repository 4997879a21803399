package lab

import (
	"maps"
	"reflect"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/meshroute"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/routestatus"
)

// The lab's mesh controller: it writes the status of HTTPRoutes and
// GRPCRoutes as a GAMMA implementation does, one RouteParentStatus per
// parentRef with two conditions: Accepted (the parent Service exists, has a
// ClusterIP and the port named, and no route of the other kind holds it)
// and ResolvedRefs (every backendRef names a port of an existing Service).
// A route's status is recomputed when a route of its namespace or a Service
// it names changes, in the same transaction, so a Service applied after its
// route turns the route's conditions True, and deleting one turns them
// False: routes never hold Services back.

// routeController names the lab in the status it writes.
const routeController gatewayv1.GatewayController = "shunt.io/lab"

// routeStatusChanges returns the routes whose status changes alter, with
// their new status.
func routeStatusChanges(next *model.Store, changes []model.Change) []manifest.Object {
	touched := map[manifest.Key]bool{}
	routesIn := map[string]bool{}                            // namespaces whose routes changed
	servicesIn := map[string]map[gatewayv1.ObjectName]bool{} // namespace -> changed Services
	for _, c := range changes {
		if !c.Changed() {
			continue
		}
		switch c.Key.Kind {
		case manifest.KindHTTPRoute, manifest.KindGRPCRoute:
			// A route can take a Service port from a route of the other
			// kind, or give it back: its namespace's routes are looked at
			// again (a route names only Services of its own namespace).
			routesIn[c.Key.Namespace] = true
		case manifest.KindService:
			if servicesIn[c.Key.Namespace] == nil {
				servicesIn[c.Key.Namespace] = map[gatewayv1.ObjectName]bool{}
			}
			servicesIn[c.Key.Namespace][gatewayv1.ObjectName(c.Key.Name)] = true
		}
	}
	for ns := range routesIn {
		for _, rt := range next.HTTPRoutesIn(ns) {
			touched[manifest.Key{Kind: manifest.KindHTTPRoute, Namespace: ns, Name: rt.Name}] = true
		}
		for _, g := range next.GRPCRoutesIn(ns) {
			touched[manifest.Key{Kind: manifest.KindGRPCRoute, Namespace: ns, Name: g.Name}] = true
		}
	}
	for ns, names := range servicesIn {
		named := func(rt *gatewayv1.HTTPRoute) bool {
			return slices.ContainsFunc(serviceNames(rt), func(n gatewayv1.ObjectName) bool { return names[n] })
		}
		for _, rt := range next.HTTPRoutesIn(ns) {
			if named(rt) {
				touched[manifest.Key{Kind: manifest.KindHTTPRoute, Namespace: ns, Name: rt.Name}] = true
			}
		}
		for _, g := range next.GRPCRoutesIn(ns) {
			if named(meshroute.HTTPForm(g)) {
				touched[manifest.Key{Kind: manifest.KindGRPCRoute, Namespace: ns, Name: g.Name}] = true
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
		// The stored route is shared with the published store: write a copy.
		var st, was gatewayv1.RouteStatus
		var updated runtime.Object
		switch rt := o.Obj.(type) {
		case *gatewayv1.HTTPRoute:
			cp := rt.DeepCopy()
			st, was, updated = routestatus.Compute(next, rt, routeController, now).RouteStatus, rt.Status.RouteStatus, cp
			cp.Status.RouteStatus = st
		case *gatewayv1.GRPCRoute:
			cp := rt.DeepCopy()
			st, was, updated = routestatus.ComputeGRPC(next, rt, routeController, now).RouteStatus, rt.Status.RouteStatus, cp
			cp.Status.RouteStatus = st
		}
		if updated == nil || reflect.DeepEqual(st, was) {
			continue
		}
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
