package agent

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/manifest"
	"github.com/shuntnet/shunt/internal/model"
)

// healthStore is a Local LoadBalancer with health check port port and an
// EndpointSlice with the given endpoints ("ADDRESS NODE READY", one a
// line).
func healthStore(t *testing.T, port int, endpoints ...string) *model.Store {
	t.Helper()
	doc := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec: {type: LoadBalancer, externalTrafficPolicy: Local, healthCheckNodePort: %d, clusterIP: 10.96.0.10, selector: {app: web}, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 80}]
endpoints:
`, port)
	for _, e := range endpoints {
		f := strings.Fields(e)
		doc += fmt.Sprintf("- {addresses: [%s], nodeName: %s, conditions: {ready: %s}}\n", f[0], f[1], f[2])
	}
	objs, err := manifest.Parse("t.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return model.NewStore(objs)
}

// TestHealthCheckServer: the healthCheckNodePort answers kube-proxy's body,
// 200 while the node has a ready endpoint of the Service, 503 when not,
// following the objects; it stops when the Service goes.
func TestHealthCheckServer(t *testing.T) {
	port := 40000 + rand.IntN(10000) // a Service's port, on loopback
	h := newHealthChecks("node-1", nil, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { h.sync(model.New()) })
	get := func() (int, string) {
		t.Helper()
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	h.sync(healthStore(t, port, "10.0.0.1 node-1 true", "10.0.0.2 node-2 true", "10.0.0.3 node-1 false"))
	if code, body := get(); code != 200 || body != `{"service":{"namespace":"default","name":"web"},"localEndpoints":1,"serviceProxyHealthy":true}` {
		t.Errorf("one ready endpoint here: %d %s", code, body)
	}
	h.sync(healthStore(t, port, "10.0.0.2 node-2 true"))
	if code, body := get(); code != 503 || !strings.Contains(body, `"localEndpoints":0`) {
		t.Errorf("none here: %d %s, want 503", code, body)
	}
	h.sync(model.New())
	if code, _ := get(); code != 0 {
		t.Errorf("the Service is gone, its port still answers %d", code)
	}
}

// TestHealthCheckServerAddresses: with addresses to listen on (those
// --nodeport-addresses selects), a health check port answers on them
// only: 127.0.0.1 answers, 127.0.0.2 (another address of the machine)
// refuses; with none, the port is served nowhere.
func TestHealthCheckServerAddresses(t *testing.T) {
	port := 40000 + rand.IntN(10000)
	status := func(addr string) int {
		t.Helper()
		c := http.Client{Timeout: 2 * time.Second}
		resp, err := c.Get(fmt.Sprintf("http://%s:%d/", addr, port))
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	h := newHealthChecks("node-1", []netip.Addr{netip.MustParseAddr("127.0.0.1")}, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { h.sync(model.New()) })
	h.sync(healthStore(t, port, "10.0.0.1 node-1 true"))
	if got := status("127.0.0.1"); got != 200 {
		t.Errorf("at 127.0.0.1, selected: %d, want 200", got)
	}
	if got := status("127.0.0.2"); got != 0 {
		t.Errorf("at 127.0.0.2, not selected: %d, want no answer", got)
	}
	h.sync(model.New())

	none := newHealthChecks("node-1", []netip.Addr{}, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { none.sync(model.New()) })
	none.sync(healthStore(t, port, "10.0.0.1 node-1 true"))
	if got := status("127.0.0.1"); got != 0 {
		t.Errorf("no address selected: 127.0.0.1 answers %d, want nothing", got)
	}
}
