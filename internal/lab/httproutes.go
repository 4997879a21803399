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
// and ResolvedRefs (every backendRef names a port of an existing Service,
// one of another namespace only where a ReferenceGrant permits it). A
// route's status is recomputed when a route of its namespace, a Service it
// names (of any namespace) or a ReferenceGrant changes, in the same
// transaction, so a Service applied after its
// route turns the route's conditions True, and deleting one turns them
// False: routes never hold Services back.

// routeController names the lab in the status it writes.
const routeController gatewayv1.GatewayController = "shunt.io/lab"

// routeStatusChanges returns the routes whose status changes alter, with
// their new status.
func routeStatusChanges(next *model.Store, changes []model.Change) []manifest.Object {
	touched := map[manifest.Key]bool{}
	routesIn := map[string]bool{} // namespaces whose routes changed
	services := map[string]bool{} // changed Services, "namespace/name"
	grantsChanged := false        // a ReferenceGrant came, changed or went
	for _, c := range changes {
		if !c.Changed() {
			continue
		}
		switch c.Key.Kind {
		case manifest.KindHTTPRoute, manifest.KindGRPCRoute:
			// A route can take a Service port from a route of the other
			// kind, or give it back: its namespace's routes are looked at
			// again.
			routesIn[c.Key.Namespace] = true
		case manifest.KindService:
			services[c.Key.Namespace+"/"+c.Key.Name] = true
		case manifest.KindReferenceGrant:
			grantsChanged = true
		}
	}
	named := func(ref string) bool { return services[ref] }
	for _, r := range meshroute.Routes(next.HTTPRoutes(), next.GRPCRoutes()) {
		if grantsChanged || routesIn[r.Namespace] || slices.ContainsFunc(serviceRefs(r.HTTPRoute), named) {
			touched[manifest.Key{Kind: r.Kind, Namespace: r.Namespace, Name: r.Name}] = true
		}
	}
	now := metav1.Now()
	view := routestatus.Of(next)
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
			st, was, updated = view.Compute(rt, routeController, now).RouteStatus, rt.Status.RouteStatus, cp
			cp.Status.RouteStatus = st
		case *gatewayv1.GRPCRoute:
			cp := rt.DeepCopy()
			st, was, updated = view.ComputeGRPC(rt, routeController, now).RouteStatus, rt.Status.RouteStatus, cp
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

// serviceRefs lists the Services a route names, parents and backends, as
// "namespace/name".
func serviceRefs(rt *gatewayv1.HTTPRoute) []string {
	var refs []string
	for _, p := range rt.Spec.ParentRefs {
		refs = append(refs, meshroute.ParentNamespace(rt, p)+"/"+string(p.Name))
	}
	for _, rule := range rt.Spec.Rules {
		for _, b := range rule.BackendRefs {
			refs = append(refs, meshroute.RefNamespace(rt, b.Namespace)+"/"+string(b.Name))
		}
	}
	return refs
}
