package labtools

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func startGRPC(t *testing.T, name string) string {
	t.Helper()
	s, err := Start(ServeConfig{Name: name, GRPC: []string{"127.0.0.1:0"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	addr, ok := strings.CutPrefix(s.Addrs()[0], "grpc ")
	if !ok {
		t.Fatalf("addrs %v", s.Addrs())
	}
	return addr
}

func TestProbeGRPC(t *testing.T) {
	addr := startGRPC(t, "pod-a")
	r := Probe("grpc", addr, opts)
	if r.Result != Connected || r.Peer != "pod-a" || r.Code != "OK" || r.Reply != "SERVING" || r.Error != "" {
		t.Errorf("grpc: %+v", r)
	}
	if r.Remote != addr || r.Local == "" {
		t.Errorf("grpc addresses: local %q, remote %q, want remote %q", r.Local, r.Remote, addr)
	}
	if got, want := r.Text(), "grpc "+addr+": connected to pod-a (OK) at "+addr; !strings.HasPrefix(got, want) {
		t.Errorf("text %q, want it to start with %q", got, want)
	}
}

func TestGRPCServerNamesThePodOnStreamsToo(t *testing.T) {
	addr := startGRPC(t, "pod-a")
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := w.Recv()
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v %v", resp, err)
	}
	if md, err := w.Header(); err != nil || md.Get(PodMetadata)[0] != "pod-a" {
		t.Errorf("watch header %v, %v", md, err)
	}
}

// unhealthy answers Check with an error and names the pod in the trailer
// only, as a trailers-only response from a proxy would.
type unhealthy struct {
	healthpb.UnimplementedHealthServer
}

func (unhealthy) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	grpc.SetTrailer(ctx, metadata.Pairs(PodMetadata, "pod-b"))
	return nil, status.Error(codes.PermissionDenied, "no you don't")
}

func TestProbeGRPCAnswersThatAreNotOK(t *testing.T) {
	// A gRPC error status is an answer, with the server's code.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, unhealthy{})
	go srv.Serve(ln)
	defer srv.Stop()
	r := ProbeGRPC(ln.Addr().String(), opts)
	if r.Result != Connected || r.Code != "PermissionDenied" || r.Peer != "pod-b" || r.Reply != "no you don't" {
		t.Errorf("grpc error status: %+v", r)
	}

	// So is a plain HTTP response, say a proxy's 403 over h2c: gRPC
	// clients see PermissionDenied.
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "denied", http.StatusForbidden)
	})}
	hs.Protocols = new(http.Protocols)
	hs.Protocols.SetUnencryptedHTTP2(true)
	hln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve(hln)
	defer hs.Close()
	r = ProbeGRPC(hln.Addr().String(), opts)
	if r.Result != Connected || r.Code != "PermissionDenied" || !strings.Contains(r.Reply, "403") {
		t.Errorf("http 403: %+v", r)
	}
}

func TestProbeGRPCRefusedAndTimeout(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	if r := ProbeGRPC(closed, opts); r.Result != Refused || !strings.Contains(r.Error, "connection refused") {
		t.Errorf("grpc to closed port: %+v", r)
	}

	// Accepts, never speaks HTTP/2.
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	short := ProbeOptions{Timeout: 200 * time.Millisecond}
	start := time.Now()
	r := ProbeGRPC(mute.Addr().String(), short)
	if d := time.Since(start); d > short.Timeout+500*time.Millisecond {
		t.Errorf("grpc blackhole: took %s for a %s timeout", d, short.Timeout)
	}
	if r.Result != Timeout || !strings.Contains(r.Error, "connected but no reply") {
		t.Errorf("grpc blackhole: %+v", r)
	}
}
