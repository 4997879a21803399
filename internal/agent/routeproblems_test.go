package agent

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

// A route whose filter holds a control byte is an object problem (an
// Event, a line of `shunt status`, shunt_object_problems) naming the
// route, rule, filter and field; a route without one is not.
func TestRouteProblemsNameInvalidFilterText(t *testing.T) {
	kind := gatewayv1.Kind("Service")
	route := func(name, value string) manifest.Object {
		return manifest.Object{Obj: &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
			Spec: gatewayv1.HTTPRouteSpec{
				CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Kind: &kind, Name: "echo"}}},
				Rules: []gatewayv1.HTTPRouteRule{{Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterResponseHeaderModifier,
					ResponseHeaderModifier: &gatewayv1.HTTPHeaderFilter{Add: []gatewayv1.HTTPHeader{{Name: "X-Tag", Value: value}}}}}}},
			}}}
	}
	var c routeProblemsCache
	got := c.of(model.NewStore([]manifest.Object{route("good", "a\tb"), route("bad", "a\nSet-Cookie: x=y")}))
	if len(got) != 1 {
		t.Fatalf("problems %+v, want one", got)
	}
	p := got[0]
	if p.Kind != "HTTPRoute" || p.Namespace != "shop" || p.Name != "bad" || p.Reason != "InvalidRouteRule" ||
		!strings.Contains(p.Message, "rules[0].filters[0] (ResponseHeaderModifier).add[0].value") || !strings.Contains(p.Message, "LF") {
		t.Errorf("problem %+v, want HTTPRoute shop/bad naming rules[0].filters[0] (ResponseHeaderModifier).add[0].value and the LF", p)
	}
}
