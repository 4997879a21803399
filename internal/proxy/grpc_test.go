package proxy

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

// A gRPC health check through a route: HTTP/2 end to end, and the status
// comes back in trailers, also when it is an error.
func TestGRPCThroughARoute(t *testing.T) {
	greeter := serveHealth(t, "greeter", "127.0.3.1", healthpb.HealthCheckResponse_SERVING)

	h := newHarness(t, proxyapi.Config{Version: 1, Mark: testMark, Endpoints: endpoints(greeter),
		Services: []proxyapi.Service{
			svcPort("default/greeter-front", "10.96.0.70", 9090), // selectorless parent
			svcPort("default/greeter", "10.96.0.71", 9090, greeter),
		},
		Routes: []proxyapi.Route{{Name: "default/greeter", Parents: []proxyapi.ParentRef{{Service: "default/greeter-front", Port: 9090}},
			Rules: []proxyapi.RouteRule{{Backends: []proxyapi.RouteBackend{{Service: "default/greeter", Port: 9090, Weight: 1}}}}}},
	})
	conn := grpcThroughProxy(t, h, "greeter-front", "10.96.0.70:9090")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(conn)
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "greeter"})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health check through the proxy: %v %v", resp, err)
	}
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "nobody"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("unknown service: %v, want NotFound from the server's trailers", err)
	}
	fl := h.nextFlow()
	if fl.HTTP.Protocol != "HTTP/2" || fl.HTTP.Path != "/grpc.health.v1.Health/Check" || fl.HTTP.Status != 200 ||
		fl.HTTP.Route != "default/greeter" || fl.HTTP.BackendPod != "default/greeter" {
		t.Errorf("flow %+v", fl.HTTP)
	}
}

// A GRPCRoute, as internal/l7 translates it: its method match is the
// path "/service/method", its header match a header match, and the proxy
// sends each call to the rule's backend; an HTTPRoute may have its name.
func TestGRPCRouteMethodAndHeaderMatch(t *testing.T) {
	v1 := serveHealth(t, "greeter-v1", "127.0.3.2", healthpb.HealthCheckResponse_SERVING)
	v2 := serveHealth(t, "greeter-v2", "127.0.3.3", healthpb.HealthCheckResponse_NOT_SERVING)
	to := func(svc string) []proxyapi.RouteBackend {
		return []proxyapi.RouteBackend{{Service: svc, Port: 9090, Weight: 1}}
	}
	h := newHarness(t, proxyapi.Config{Version: 1, Mark: testMark, Endpoints: endpoints(v1, v2),
		Services: []proxyapi.Service{
			svcPort("default/greeter", "10.96.0.72", 9090),
			svcPort("default/greeter-v1", "10.96.0.73", 9090, v1),
			svcPort("default/greeter-v2", "10.96.0.74", 9090, v2),
		},
		Routes: []proxyapi.Route{
			{Name: "default/greeter", Kind: "GRPCRoute", Parents: []proxyapi.ParentRef{{Service: "default/greeter", Port: 9090}}, Rules: []proxyapi.RouteRule{
				{Matches: []proxyapi.Match{{Path: &proxyapi.PathMatch{Type: proxyapi.MatchExact, Value: "/grpc.health.v1.Health/Check"},
					Headers: []proxyapi.HeaderMatch{{Name: "x-version", Value: "2"}}}}, Backends: to("default/greeter-v2")},
				{Matches: []proxyapi.Match{{Path: &proxyapi.PathMatch{Type: proxyapi.MatchPathPrefix, Value: "/grpc.health.v1.Health"}}}, Backends: to("default/greeter-v1")},
				{Matches: []proxyapi.Match{{Path: &proxyapi.PathMatch{Type: proxyapi.MatchExact, Value: "/grpc.health.v1.Health/Check"},
					Headers: []proxyapi.HeaderMatch{{Name: "x-version", Value: "3"}}}},
					Backends: []proxyapi.RouteBackend{{Service: "default/gone", Port: 9090, Weight: 1, Unresolved: "service default/gone not found"}}},
			}},
			{Name: "default/greeter", Parents: []proxyapi.ParentRef{{Service: "default/greeter-v1", Port: 9090}},
				Rules: []proxyapi.RouteRule{{Backends: to("default/greeter-v1")}}},
		},
	})
	conn := grpcThroughProxy(t, h, "greeter", "10.96.0.72:9090")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(conn)
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "greeter"})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Check without x-version: %v %v, want SERVING from greeter-v1", resp, err)
	}
	if fl := h.nextFlow(); fl.HTTP.Route != "default/greeter" || fl.HTTP.BackendPod != "default/greeter-v1" {
		t.Errorf("flow %+v, want default/greeter to greeter-v1", fl.HTTP)
	}
	resp, err = hc.Check(metadata.AppendToOutgoingContext(ctx, "x-version", "2"), &healthpb.HealthCheckRequest{Service: "greeter"})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("Check with x-version 2: %v %v, want NOT_SERVING from greeter-v2", resp, err)
	}
	if fl := h.nextFlow(); fl.HTTP.Route != "default/greeter" || fl.HTTP.BackendPod != "default/greeter-v2" {
		t.Errorf("flow %+v, want default/greeter to greeter-v2", fl.HTTP)
	}

	// The proxy's own refusals are gRPC statuses: a backendRef that does
	// not resolve is UNAVAILABLE (the GRPCRoute spec), a call no rule
	// matches UNIMPLEMENTED; the flows keep the HTTP status.
	_, err = hc.Check(metadata.AppendToOutgoingContext(ctx, "x-version", "3"), &healthpb.HealthCheckRequest{Service: "greeter"})
	if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "service default/gone not found") {
		t.Errorf("Check to an unresolved backendRef: %v, want Unavailable naming the backendRef", err)
	}
	if fl := h.nextFlow(); fl.HTTP.Status != 500 || fl.DropReason != reasonUnresolved {
		t.Errorf("flow %+v (%s), want 500, %s", fl.HTTP, fl.DropReason, reasonUnresolved)
	}
	err = conn.Invoke(ctx, "/other.Service/Call", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
	if st := status.Convert(err); st.Code() != codes.Unimplemented || !strings.Contains(st.Message(), "no route of default/greeter:9090 matches POST /other.Service/Call") {
		t.Errorf("a call no rule matches: %v, want Unimplemented", err)
	}
}

// serveHealth serves gRPC health checks on ip:0, the service "greeter" in
// status st.
func serveHealth(t *testing.T, name, ip string, st healthpb.HealthCheckResponse_ServingStatus) *testBackend {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("greeter", st)
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return &testBackend{name: name, addr: netip.MustParseAddrPort(ln.Addr().String())}
}

// grpcThroughProxy is a gRPC client of the frontend pod whose connection
// the proxy takes as one dialled to dst (a service port), with authority
// host.
func grpcThroughProxy(t *testing.T, h *harness, host, dst string) *grpc.ClientConn {
	t.Helper()
	h.dials(frontend, dst)
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(frontend.ip)}}
	_, port, _ := net.SplitHostPort(dst)
	conn, err := grpc.NewClient("passthrough:///"+host+":"+port,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return d.DialContext(ctx, "tcp", h.addr) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// A gRPC call an HTTP policy denies is PERMISSION_DENIED to the client,
// and a 403 in its flow.
func TestGRPCPolicyDenialIsAGRPCStatus(t *testing.T) {
	greeter := serveHealth(t, "greeter", "127.0.3.4", healthpb.HealthCheckResponse_SERVING)
	h := newHarness(t, proxyapi.Config{Version: 1, Mark: testMark, Endpoints: endpoints(greeter),
		Services: []proxyapi.Service{svcPort("default/greeter", "10.96.0.75", 9090, greeter)},
		Policies: []proxyapi.PortPolicy{{Endpoint: greeter.addr.Addr().String(), Port: greeter.addr.Port(), Isolated: true,
			Rules: []proxyapi.L7Rule{{Name: "health-only", Action: proxyapi.ActionAllow, AnyPeer: true,
				HTTP: []proxyapi.HTTPRule{{Path: "/grpc.health.v1.Health/Check"}}}}}},
	})
	conn := grpcThroughProxy(t, h, "greeter", "10.96.0.75:9090")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "greeter"}); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("allowed Check: %v %v", resp, err)
	}
	if fl := h.nextFlow(); fl.HTTP.Status != 200 {
		t.Errorf("flow %+v, want 200", fl.HTTP)
	}
	err := conn.Invoke(ctx, "/other.Service/Call", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
	if st := status.Convert(err); st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), "health-only") {
		t.Errorf("a call the policy denies: %v, want PermissionDenied naming the rule", err)
	}
	if fl := h.nextFlow(); fl.HTTP.Status != 403 || fl.Verdict != "DROPPED" {
		t.Errorf("flow %+v (%s), want 403, dropped", fl.HTTP, fl.Verdict)
	}
}
