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
	"k8s.io/client-go/dynamic"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/shuntnet/shunt/internal/kubesource"
	"github.com/shuntnet/shunt/internal/model"
	"github.com/shuntnet/shunt/internal/routestatus"
)

// meshController names shunt in the HTTPRoute status it writes on a
// Kubernetes cluster, as a GAMMA implementation does.
const meshController gatewayv1.GatewayController = "shunt.io/mesh"

// routeStatus writes the status of the cluster's HTTPRoutes attached to
// Services (Kubernetes mode): shunt's own entries among their parents,
// other controllers' entries kept. Every node computes the same status
// from the same objects and writes only when it differs, so nodes agree
// and a conflict is settled by the next pass.
type routeStatus struct {
	res     dynamic.NamespaceableResourceInterface
	objects func() *model.Store
	settled func() bool
	log     *slog.Logger
}

func newRouteStatus(dyn dynamic.Interface, objects func() *model.Store, settled func() bool, log *slog.Logger) *routeStatus {
	return &routeStatus{res: dyn.Resource(kubesource.HTTPRouteGVR), objects: objects, settled: settled, log: log.With("component", "route-status")}
}

func (w *routeStatus) write(ctx context.Context) {
	if !w.settled() {
		return
	}
	store := w.objects()
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	for _, rt := range store.HTTPRoutes() {
		var parents []gatewayv1.RouteParentStatus
		for _, p := range rt.Status.Parents {
			if p.ControllerName != meshController {
				parents = append(parents, p)
			}
		}
		parents = append(parents, routestatus.Compute(store, rt, meshController, now).Parents...)
		if equality.Semantic.DeepEqual(parents, rt.Status.Parents) {
			continue
		}
		next := rt.DeepCopy()
		next.Status.Parents = parents
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(next)
		if err != nil {
			w.log.Warn("HTTPRoute status", "route", rt.Namespace+"/"+rt.Name, "err", err)
			continue
		}
		obj := &unstructured.Unstructured{Object: u}
		obj.SetAPIVersion(gatewayv1.GroupVersion.String())
		obj.SetKind("HTTPRoute")
		_, err = w.res.Namespace(rt.Namespace).UpdateStatus(ctx, obj, metav1.UpdateOptions{FieldManager: "shuntd"})
		if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			w.log.Warn("writing HTTPRoute status", "route", rt.Namespace+"/"+rt.Name, "err", err)
		}
	}
}
