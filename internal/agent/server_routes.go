package agent

import (
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/shuntnet/shunt/internal/manifest"
)

// handleHTTPRoutes lists every HTTPRoute with the status the lab's mesh
// controller wrote: a v1 List of gateway.networking.k8s.io/v1 objects.
func (a *Agent) handleHTTPRoutes(w http.ResponseWriter, r *http.Request) {
	list := gatewayv1.HTTPRouteList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"},
		Items: []gatewayv1.HTTPRoute{}}
	for _, rt := range a.objects().HTTPRoutes() {
		route := *rt.DeepCopy()
		route.APIVersion, route.Kind = manifest.GatewayAPIVersion, manifest.KindHTTPRoute
		list.Items = append(list.Items, route)
	}
	writeJSON(w, http.StatusOK, list)
}

// handleGRPCRoutes lists every GRPCRoute as handleHTTPRoutes lists
// HTTPRoutes, with the status the lab's mesh controller (or, from an API
// server, the agent's route-status writer) gave it.
func (a *Agent) handleGRPCRoutes(w http.ResponseWriter, r *http.Request) {
	list := gatewayv1.GRPCRouteList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"},
		Items: []gatewayv1.GRPCRoute{}}
	for _, rt := range a.objects().GRPCRoutes() {
		route := *rt.DeepCopy()
		route.APIVersion, route.Kind = manifest.GatewayAPIVersion, manifest.KindGRPCRoute
		list.Items = append(list.Items, route)
	}
	writeJSON(w, http.StatusOK, list)
}
