package labtools

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// PodMetadata is the gRPC response metadata naming the pod that answered:
// X-Shunt-Pod, in the lower case gRPC metadata keys have.
const PodMetadata = "x-shunt-pod"

// newGRPCServer is the lab's gRPC server: the standard health service,
// which any gRPC client and the proxy's tests can call without generated
// code of ours, with the pod's name on every call.
func (s *Server) newGRPCServer() *grpc.Server {
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			grpc.SetHeader(ctx, metadata.Pairs(PodMetadata, s.name))
			return handler(ctx, req)
		}),
		// Health/Watch is a stream: name the pod there too.
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			ss.SetHeader(metadata.Pairs(PodMetadata, s.name))
			return handler(srv, ss)
		}),
	)
	// NewServer reports the whole server ("") as SERVING.
	healthpb.RegisterHealthServer(srv, health.NewServer())
	return srv
}

// ProbeGRPC makes one health Check call (the whole server, service "") on a
// new connection. As for HTTP, any answer is Connected: Code has the gRPC
// status code, Reply the serving status (or the status message when the call
// failed), Peer the x-shunt-pod metadata.
func ProbeGRPC(target string, o ProbeOptions) Result {
	r := Result{Proto: "grpc", Target: target}
	start := time.Now()
	// As in ProbeHTTP, the dial runs in the client's goroutines and may
	// outlive the call: hence the mutex.
	var mu sync.Mutex
	var local, remote string
	var dialErr error
	dialer := &net.Dialer{}
	answer := &answerSeen{}
	// passthrough: dial HOST:PORT as the other probes do, without gRPC's
	// own resolver; no proxy from the environment, no retries: one call
	// on one connection.
	conn, err := grpc.NewClient("passthrough:///"+target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithNoProxy(),
		grpc.WithDisableRetry(),
		grpc.WithStatsHandler(answer),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, "tcp", addr)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				dialErr = err
				return nil, err
			}
			local, remote = c.LocalAddr().String(), c.RemoteAddr().String()
			return c, nil
		}),
	)
	if err != nil {
		return r.fail(err, start)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	defer cancel()
	var header, trailer metadata.MD
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{},
		grpc.Header(&header), grpc.Trailer(&trailer))
	mu.Lock()
	r.Local, r.Remote = local, remote
	connected, dialErr := local != "", dialErr
	mu.Unlock()

	st := status.Convert(err)
	switch {
	case err == nil:
		r = r.answered(resp.GetStatus().String(), start)
	case answer.seen.Load() || fromHTTPStatus(st):
		r = r.answered(st.Message(), start)
	case !connected && dialErr != nil:
		return r.fail(dialErr, start)
	case st.Code() == codes.DeadlineExceeded:
		r = r.fail(err, start)
		r.Result = Timeout
		if connected {
			r.Error = "connected but no reply: " + r.Error
		}
		return r
	default:
		return r.fail(err, start)
	}
	r.Code = st.Code().String()
	// A trailers-only response (an error with no headers before it, as
	// proxies send) carries the metadata in the trailer.
	r.Peer = firstOf(header.Get(PodMetadata), trailer.Get(PodMetadata))
	return r
}

// fromHTTPStatus tells a status grpc-go made up from a non-gRPC HTTP
// response (a proxy's plain 403, say): an answer, though not a gRPC one.
// grpc-go says so only in the message.
func fromHTTPStatus(st *status.Status) bool {
	return strings.HasPrefix(st.Message(), "unexpected HTTP status code received from server")
}

func firstOf(vals ...[]string) string {
	for _, v := range vals {
		if len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// answerSeen is a client stats handler that notes response headers or
// trailers: then the call's status is the server's, not one the client
// made up for a refused, broken or timed-out connection.
type answerSeen struct{ seen atomic.Bool }

func (a *answerSeen) HandleRPC(_ context.Context, s stats.RPCStats) {
	switch s.(type) {
	case *stats.InHeader, *stats.InTrailer:
		a.seen.Store(true)
	}
}

func (a *answerSeen) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return ctx
}

func (a *answerSeen) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (a *answerSeen) HandleConn(context.Context, stats.ConnStats) {}
