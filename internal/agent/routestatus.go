package agent

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/shuntnet/shunt/internal/kubesource"
	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/routestatus"
)

// meshController names shunt in the HTTPRoute and GRPCRoute status it writes on a
// Kubernetes cluster, as a GAMMA implementation does.
const meshController gatewayv1.GatewayController = "shunt.io/mesh"

// routeStatus writes the status of the cluster's HTTPRoutes and GRPCRoutes
// attached to Services (Kubernetes mode): shunt's own entries among their
// parents, other controllers' entries kept. Every node computes the same
// status from the same objects and writes only when it differs, so nodes
// agree and a conflict is settled by the next pass.
type routeStatus struct {
	dyn     dynamic.Interface
	objects func() *model.Store
	settled func() bool
	log     *slog.Logger
}

func newRouteStatus(dyn dynamic.Interface, objects func() *model.Store, settled func() bool, log *slog.Logger) *routeStatus {
	return &routeStatus{dyn: dyn, objects: objects, settled: settled, log: log.With("component", "route-status")}
}

func (w *routeStatus) write(ctx context.Context) {
	if !w.settled() {
		return
	}
	store := w.objects()
	view := routestatus.Of(store)
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	for _, rt := range store.HTTPRoutes() {
		if parents, changed := withParents(rt.Status.Parents, view.Compute(rt, meshController, now).Parents); changed {
			next := rt.DeepCopy()
			next.Status.Parents = parents
			w.update(ctx, kubesource.HTTPRouteGVR, manifest.KindHTTPRoute, next)
		}
	}
	for _, g := range store.GRPCRoutes() {
		if parents, changed := withParents(g.Status.Parents, view.ComputeGRPC(g, meshController, now).Parents); changed {
			next := g.DeepCopy()
			next.Status.Parents = parents
			w.update(ctx, kubesource.GRPCRouteGVR, manifest.KindGRPCRoute, next)
		}
	}
}

// withParents is a route's status parents with other controllers' entries
// kept and shunt's replaced by the computed ones; changed is false when
// they are what the route has.
func withParents(current, computed []gatewayv1.RouteParentStatus) (parents []gatewayv1.RouteParentStatus, changed bool) {
	for _, p := range current {
		if p.ControllerName != meshController {
			parents = append(parents, p)
		}
	}
	parents = append(parents, computed...)
	return parents, !equality.Semantic.DeepEqual(parents, current)
}

func (w *routeStatus) update(ctx context.Context, gvr schema.GroupVersionResource, kind string, rt runtime.Object) {
	m, ok := rt.(metav1.Object)
	if !ok {
		return
	}
	name := m.GetNamespace() + "/" + m.GetName()
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(rt)
	if err != nil {
		w.log.Warn(kind+" status", "route", name, "err", err)
		return
	}
	obj := &unstructured.Unstructured{Object: u}
	obj.SetAPIVersion(gatewayv1.GroupVersion.String())
	obj.SetKind(kind)
	_, err = w.dyn.Resource(gvr).Namespace(m.GetNamespace()).UpdateStatus(ctx, obj, metav1.UpdateOptions{FieldManager: "shuntd"})
	if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		w.log.Warn("writing "+kind+" status", "route", name, "err", err)
	}
}
