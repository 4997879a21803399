package proxy

import (
	"context"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/shuntnet/shunt/internal/flows"
	"github.com/shuntnet/shunt/internal/proxy/l7policy"
	"github.com/shuntnet/shunt/internal/proxyapi"
)

// identityWorld is the identity of a client no endpoint names.
const identityWorld = 2

// exchange is one request on its way: who asked, where it goes, how it
// ended. It becomes the request's flow record and metrics. The handler,
// the reverse proxy and its transport run on the request's goroutine, so
// it needs no lock.
type exchange struct {
	start  time.Time
	req    *http.Request // as received: its context ends when the client goes
	conn   *clientConn
	t      *table
	client *proxyapi.Endpoint // nil: unknown (world)
	peer   l7policy.Peer
	cidr   netip.Prefix // the policy prefix of a client outside (peer.CIDRIdentity's)
	up     *transports
	target target

	backend    backend // of the last attempt
	status     int     // answered to the client; 0: none
	policyRule string
	refused    *refusal
	reason     string // why no response came (flows' reason), with err
	err        string
}

type exchangeKey struct{}

func exchangeOf(ctx context.Context) *exchange { return ctx.Value(exchangeKey{}).(*exchange) }

func (t *table) newExchange(r *http.Request, c *clientConn) *exchange {
	x := &exchange{start: time.Now(), req: r, conn: c, t: t, client: t.endpoints[c.remote.Addr()]}
	x.peer = l7policy.Peer{Identity: identityWorld, IP: c.remote.Addr()}
	if x.client != nil {
		x.peer.Identity, x.peer.CIDRIdentity = x.client.Identity, x.client.CIDRIdentity
	} else {
		// Outside the cluster: the policy prefix holding the address
		// names it, as at L3/L4.
		x.peer.CIDRIdentity, x.cidr = t.cidrIdentityOf(c.remote.Addr())
	}
	return x
}

// marks are the upstream marks of every client the table names: the
// transports worth keeping.
func (t *table) marks() map[uint32]bool {
	keep := map[uint32]bool{}
	for _, ep := range t.endpoints {
		if m, ok := t.cfg.Mark.For(ep.Identity); ok {
			keep[m] = true
		}
	}
	if m, ok := t.cfg.Mark.For(identityWorld); ok {
		keep[m] = true
	}
	return keep
}

// flow is the exchange's flow record.
func (x *exchange) flow(latency time.Duration) flows.Flow {
	fl := x.httpFlow(x.req, "forwarded")
	fl.Time, fl.Policy = x.start, x.policyRule
	fl.HTTP.Status, fl.HTTP.LatencyMicros, fl.HTTP.Error = x.status, latency.Microseconds(), x.err
	switch {
	case x.backend.addr.IsValid():
		x.toBackend(&fl, x.backend)
	case !x.t.vips[x.conn.orig.Addr()]:
		fl.Destination = x.endpoint(x.conn.orig) // a pod, refused before the attempt
	}
	switch {
	case x.refused != nil:
		fl.Verdict, fl.DropReason, fl.Reason = "DROPPED", x.refused.reason, x.refused.reason
		fl.HTTP.Error = x.refused.msg
	case x.reason != "":
		fl.Reason = x.reason
	}
	return fl
}

// httpFlow is what the exchange's flow records share, the request's and
// its mirror copies' (copyFlow): the client, the Service it dialled, the
// route, and r's method, path and host, forwarded for reason.
func (x *exchange) httpFlow(r *http.Request, reason string) flows.Flow {
	fl := flows.Flow{
		Verdict: "FORWARDED", Reason: reason, Event: "http", Point: "proxy", Protocol: "HTTP",
		Source: x.endpoint(x.conn.remote),
		HTTP:   &flows.HTTP{Method: r.Method, Path: r.URL.Path, Host: r.Host, Protocol: httpProtocol(x.req)},
	}
	fl.Source.Identity = x.peer.Identity
	if x.target.rule != nil {
		fl.HTTP.Route = x.target.rule.route
	}
	if svc := x.t.byVIP[x.conn.orig]; svc != nil {
		fl.Service = &flows.Service{Name: svc.label, IP: svc.vipText, Port: svc.vip.Port()}
	}
	return fl
}

// toBackend names b as fl's destination, as the configured endpoints or
// the service's backend list know it.
func (x *exchange) toBackend(fl *flows.Flow, b backend) {
	fl.Destination = x.endpoint(b.addr)
	fl.HTTP.Backend, fl.HTTP.BackendPod = b.addrText(), b.pod
	if fl.Destination.Pod == "" {
		fl.Destination.Pod, fl.Destination.Namespace = b.pod, namespace(b.pod)
	}
}

// endpoint names an address from the configured endpoints.
func (x *exchange) endpoint(a netip.AddrPort) flows.Endpoint {
	e := flows.Endpoint{Port: a.Port()}
	if ep := x.t.endpoints[a.Addr()]; ep != nil {
		e.IP = x.t.ipText[a.Addr()]
		e.Pod, e.Namespace, e.Identity, e.Labels = ep.Pod, namespace(ep.Pod), ep.Identity, ep.Labels
		return e
	}
	e.IP = a.Addr().String()
	if a == x.conn.remote {
		e.Labels = []string{"reserved:world"}
		if x.cidr.IsValid() {
			e.Labels = append(e.Labels, "cidr:"+x.cidr.String())
		}
	}
	return e
}

func namespace(pod string) string {
	ns, _, ok := strings.Cut(pod, "/")
	if !ok {
		return ""
	}
	return ns
}

func httpProtocol(r *http.Request) string {
	switch {
	case r.ProtoMajor == 2:
		return "HTTP/2"
	case r.ProtoMajor == 1 && r.ProtoMinor == 1:
		return "HTTP/1.1" // most requests: no string to build
	}
	return "HTTP/" + strconv.Itoa(r.ProtoMajor) + "." + strconv.Itoa(r.ProtoMinor)
}
