package lab

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

// reviewsRoute splits reviews 90/10 between two versions; extra is added
// to its parentRef.
func reviewsRoute(extra string) string {
	return "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: reviews}\nspec:\n" +
		"  parentRefs: [{group: '', kind: Service, name: reviews" + extra + "}]\n" +
		"  rules:\n  - backendRefs: [{name: reviews-v1, port: 9080, weight: 90}, {name: reviews-v2, port: 9080, weight: 10}]\n"
}

func svcPort(name string, port int) string {
	return "---\napiVersion: v1\nkind: Service\nmetadata: {name: " + name + "}\nspec: {ports: [{port: " + strconv.Itoa(port) + "}]}\n"
}

func routeOf(t *testing.T, s *model.Store) *gatewayv1.HTTPRoute {
	t.Helper()
	o, ok := s.Get(manifest.Key{Kind: manifest.KindHTTPRoute, Namespace: "default", Name: "reviews"})
	if !ok {
		t.Fatal("route reviews not stored")
	}
	return o.Obj.(*gatewayv1.HTTPRoute)
}

// conditions prints a route's conditions, parent by parent:
// "reviews: Accepted=True/Accepted ResolvedRefs=False/BackendNotFound".
func conditions(rt *gatewayv1.HTTPRoute) string {
	var parents []string
	for _, p := range rt.Status.Parents {
		s := string(p.ParentRef.Name) + ":"
		for _, c := range p.Conditions {
			s += " " + c.Type + "=" + string(c.Status) + "/" + c.Reason
		}
		parents = append(parents, s)
	}
	return strings.Join(parents, ", ")
}

func condition(t *testing.T, rt *gatewayv1.HTTPRoute, typ gatewayv1.RouteConditionType) metav1.Condition {
	t.Helper()
	for _, c := range rt.Status.Parents[0].Conditions {
		if c.Type == string(typ) {
			return c
		}
	}
	t.Fatalf("no %s condition: %+v", typ, rt.Status)
	return metav1.Condition{}
}

// TestHTTPRouteStatus: the mesh controller writes one parent status per
// parentRef, and its conditions follow the Services the route names as
// they come and go; deleting a Service a route names is not refused.
func TestHTTPRouteStatus(t *testing.T) {
	cp, node := newControlPlane(t)
	ctx := context.Background()
	apply := func(doc string) []model.Change {
		t.Helper()
		ch, err := cp.Apply(ctx, docs(doc))
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}

	// Applied before its Services: nothing to attach to, nothing resolved.
	if got := actions(apply(reviewsRoute(""))); got != "HTTPRoute/default/reviews=created" {
		t.Errorf("changes %s", got)
	}
	if got := actions(node.changes); got != "HTTPRoute/default/reviews=created" {
		t.Errorf("the node got changes %s: the status the controller wrote is part of the creation", got)
	}
	rt := routeOf(t, cp.Store())
	if got := conditions(rt); got != "reviews: Accepted=False/NoMatchingParent ResolvedRefs=False/BackendNotFound" {
		t.Fatalf("conditions %s", got)
	}
	p := rt.Status.Parents[0]
	if p.ControllerName != "shunt.io/lab" || *p.ParentRef.Kind != "Service" || rt.Generation != 1 {
		t.Errorf("parent status %+v, generation %d", p, rt.Generation)
	}
	if c := condition(t, rt, gatewayv1.RouteConditionAccepted); c.Message != "Service reviews not found" || c.ObservedGeneration != 1 {
		t.Errorf("Accepted %+v", c)
	}
	if c := condition(t, rt, gatewayv1.RouteConditionResolvedRefs); c.Message != "backendRefs not resolved: "+
		"reviews-v1:9080: Service reviews-v1 not found; reviews-v2:9080: Service reviews-v2 not found" {
		t.Errorf("ResolvedRefs message %q", c.Message)
	}

	// The parent appears: accepted. A backend with another port resolves
	// nothing yet.
	apply(svcPort("reviews", 9080) + svcPort("reviews-v1", 9080) + svcPort("reviews-v2", 8080))
	if got := actions(node.changes); !strings.HasSuffix(got, " HTTPRoute/default/reviews=configured") {
		t.Errorf("the node got changes %s: want the route's new status in the same update", got)
	}
	rt = routeOf(t, cp.Store())
	if got := conditions(rt); got != "reviews: Accepted=True/Accepted ResolvedRefs=False/BackendNotFound" {
		t.Fatalf("after the services: %s", got)
	}
	if c := condition(t, rt, gatewayv1.RouteConditionResolvedRefs); c.Message != "backendRefs not resolved: reviews-v2:9080: Service reviews-v2 has no TCP port 9080" {
		t.Errorf("ResolvedRefs message %q", c.Message)
	}
	acceptedAt := condition(t, rt, gatewayv1.RouteConditionAccepted).LastTransitionTime

	apply(svcPort("reviews", 9080) + svcPort("reviews-v1", 9080) + svcPort("reviews-v2", 9080))
	rt = routeOf(t, cp.Store())
	if got := conditions(rt); got != "reviews: Accepted=True/Accepted ResolvedRefs=True/ResolvedRefs" {
		t.Fatalf("after fixing reviews-v2: %s", got)
	}
	if c := condition(t, rt, gatewayv1.RouteConditionAccepted); !c.LastTransitionTime.Equal(&acceptedAt) {
		t.Errorf("Accepted did not change, but its lastTransitionTime did: %v, was %v", c.LastTransitionTime, acceptedAt)
	}

	// The same manifest again changes nothing, status and generation
	// included; a changed spec is a new generation, judged again.
	if got := actions(apply(reviewsRoute(""))); got != "HTTPRoute/default/reviews=unchanged" {
		t.Errorf("the same route again: %s", got)
	}
	apply(reviewsRoute(", port: 9090"))
	rt = routeOf(t, cp.Store())
	if c := condition(t, rt, gatewayv1.RouteConditionAccepted); rt.Generation != 2 || c.Status != metav1.ConditionFalse ||
		c.Message != "Service reviews has no TCP port 9090" || c.ObservedGeneration != 2 {
		t.Errorf("generation %d, Accepted %+v", rt.Generation, c)
	}
	apply(reviewsRoute(", port: 9080"))

	// Deleting a backend is not refused: the route no longer resolves.
	ch, err := cp.Delete(ctx, docs(svcPort("reviews-v2", 9080)))
	if err != nil || actions(ch) != "Service/default/reviews-v2=deleted" {
		t.Fatalf("deleting reviews-v2: %s %v", actions(ch), err)
	}
	rt = routeOf(t, cp.Store())
	if got := conditions(rt); got != "reviews: Accepted=True/Accepted ResolvedRefs=False/BackendNotFound" {
		t.Errorf("after deleting reviews-v2: %s", got)
	}

	// Nothing to recompute for routes that name none of the changed
	// Services: the route object stays the one stored.
	apply(svcPort("other", 80))
	if routeOf(t, cp.Store()) != rt {
		t.Error("a Service the route does not name rewrote the route")
	}

	ch, err = cp.Delete(ctx, docs(reviewsRoute("")))
	if err != nil || actions(ch) != "HTTPRoute/default/reviews=deleted" {
		t.Errorf("deleting the route: %s %v", actions(ch), err)
	}
}

// TestHTTPRouteSurvivesReload: a route is journaled with its status and
// reads back, strictly decoded, as it was stored.
func TestHTTPRouteSurvivesReload(t *testing.T) {
	cp, _ := newControlPlane(t)
	if _, err := cp.Apply(context.Background(), docs(svcPort("reviews", 9080)+reviewsRoute(", port: 9080"))); err != nil {
		t.Fatal(err)
	}
	stored, err := (&objectLog{dir: cp.journal.dir}).load()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeObjects(stored)
	if err != nil {
		t.Fatal(err)
	}
	reloaded := routeOf(t, model.NewStore(objs))
	want, _ := json.Marshal(routeOf(t, cp.Store()))
	if got, _ := json.Marshal(reloaded); string(got) != string(want) {
		t.Errorf("reloaded route:\n%s\nwant:\n%s", got, want)
	}
	if got := conditions(reloaded); got != "reviews: Accepted=True/Accepted ResolvedRefs=False/BackendNotFound" {
		t.Errorf("reloaded conditions %s", got)
	}
}

// TestGRPCRouteStatus: the lab writes a GRPCRoute's status as an
// HTTPRoute's; on a Service port an older HTTPRoute holds, the GRPCRoute
// is not accepted, and it is once that route is gone.
func TestGRPCRouteStatus(t *testing.T) {
	cp, _ := newControlPlane(t)
	ctx := context.Background()
	const grpcRoute = "---\napiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: reviews-grpc}\nspec:\n" +
		"  parentRefs: [{group: '', kind: Service, name: reviews, port: 9080}]\n" +
		"  rules:\n  - matches: [{method: {service: reviews.Reviews}}]\n    backendRefs: [{name: reviews-v1, port: 9080}]\n"
	grpcOf := func() *gatewayv1.GRPCRoute {
		t.Helper()
		o, ok := cp.Store().Get(manifest.Key{Kind: manifest.KindGRPCRoute, Namespace: "default", Name: "reviews-grpc"})
		if !ok {
			t.Fatal("GRPCRoute reviews-grpc not stored")
		}
		return o.Obj.(*gatewayv1.GRPCRoute)
	}
	if _, err := cp.Apply(ctx, docs(svcPort("reviews", 9080)+svcPort("reviews-v1", 9080)+svcPort("reviews-v2", 9080)+reviewsRoute(""))); err != nil {
		t.Fatal(err)
	}
	ch, err := cp.Apply(ctx, docs(grpcRoute))
	if err != nil {
		t.Fatal(err)
	}
	if got := actions(ch); got != "GRPCRoute/default/reviews-grpc=created" {
		t.Errorf("changes %s", got)
	}
	g := grpcOf()
	if got := conditions(&gatewayv1.HTTPRoute{Status: gatewayv1.HTTPRouteStatus{RouteStatus: g.Status.RouteStatus}}); got != "reviews: Accepted=False/RouteConflict ResolvedRefs=True/ResolvedRefs" {
		t.Errorf("GRPCRoute conditions %s, want not accepted: the HTTPRoute reviews is older", got)
	}
	if g.Generation != 1 || g.Status.Parents[0].ControllerName != "shunt.io/lab" {
		t.Errorf("generation %d, parent %+v", g.Generation, g.Status.Parents[0])
	}
	if got := conditions(routeOf(t, cp.Store())); got != "reviews: Accepted=True/Accepted ResolvedRefs=True/ResolvedRefs" {
		t.Errorf("the HTTPRoute's conditions %s", got)
	}
	// The HTTPRoute goes: the GRPCRoute takes the port.
	if _, err := cp.Delete(ctx, docs(reviewsRoute(""))); err != nil {
		t.Fatal(err)
	}
	if got := conditions(&gatewayv1.HTTPRoute{Status: gatewayv1.HTTPRouteStatus{RouteStatus: grpcOf().Status.RouteStatus}}); got != "reviews: Accepted=True/Accepted ResolvedRefs=True/ResolvedRefs" {
		t.Errorf("GRPCRoute conditions after the HTTPRoute's deletion: %s", got)
	}
}
