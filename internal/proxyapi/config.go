// Package proxyapi is the contract between the agent and the node proxy
// (cmd/shunt-proxy): the complete, versioned configuration the agent pushes,
// the proxy's status, and the client the agent uses on the proxy's control
// socket. The agent computes a Config from the cluster's objects; the proxy
// only obeys it, so it needs no Kubernetes types and no view of the store.
package proxyapi

import (
	"encoding/json"
	"fmt"
	"time"
)

// Config is everything the proxy serves. Each push replaces the previous
// configuration whole; a push whose Version is lower than the one in force is
// refused (a restarted agent starts from the proxy's version, see Status).
type Config struct {
	Version uint64 `json:"version"`
	// Listen is where the proxy accepts redirected connections: the node's
	// address and the proxy port, e.g. 10.200.1.1:15001. The socket hooks
	// send connections here; the original destination comes back through
	// getsockopt(SOL_IP, SO_ORIGINAL_DST) on the accepted socket.
	Listen string `json:"listen"`
	// SteerListen, if set, is where the proxy keeps a transparent listener
	// (IP_TRANSPARENT) for the connections the tc programs give it
	// (bpf_sk_assign): clients no socket hook of this node sees, another
	// node's pods and clients outside, reaching a local pod's port with
	// HTTP rules. An accepted socket's local address is the original
	// destination; its peer is the client.
	SteerListen string `json:"steerListen,omitempty"`
	Mark        Mark   `json:"mark"`
	// Complete: the agent built this configuration from a complete view of
	// the cluster (its source had delivered every object). A restarted
	// agent may compute configurations before that, without routes or
	// services it has not heard of yet; a proxy that holds a complete
	// configuration refuses an incomplete one (*proxy.IncompleteError) and
	// keeps serving what it has.
	Complete bool `json:"complete,omitempty"`
	// DialTimeout bounds an upstream connect (a SYN dropped by L3/L4 policy
	// would otherwise hang a request); 0: 2s.
	DialTimeout Duration `json:"dialTimeout,omitempty"`

	Endpoints []Endpoint   `json:"endpoints,omitempty"` // local pods, to name clients and backends
	Services  []Service    `json:"services,omitempty"`  // service ports: original destinations and route backends
	Routes    []Route      `json:"routes,omitempty"`    // HTTPRoutes and GRPCRoutes, by parent service port
	Policies  []PortPolicy `json:"policies,omitempty"`  // L7 ingress rules, by (pod, port)
	// CIDRIdentities are the prefixes policies name (ipBlock), with their
	// identities, as the datapath's shunt_cidr_identities holds them: a
	// client no endpoint names (outside the cluster, steered to the
	// proxy) is judged by the identity of the longest prefix holding its
	// address, which rules naming address blocks list, as at L3/L4.
	CIDRIdentities []CIDRIdentity `json:"cidrIdentities,omitempty"`
}

// CIDRIdentity is one prefix a policy names and its identity.
type CIDRIdentity struct {
	Prefix   string `json:"prefix"` // e.g. 203.0.113.0/24
	Identity uint32 `json:"identity"`
}

// Mark is the SO_MARK layout of the proxy's upstream sockets: Magic under
// Mask says "the proxy", the bits outside Mask carry the client's identity,
// so the tc programs judge the upstream connection as the original client
// and the socket hooks leave it alone. Identities that do not fit outside
// Mask cannot be carried: the proxy refuses such clients (403, flow).
type Mark struct {
	Magic uint32 `json:"magic"`
	Mask  uint32 `json:"mask"`
}

// For returns the mark of upstream sockets opened for a client identity and
// whether the identity fits.
func (m Mark) For(identity uint32) (uint32, bool) {
	if identity&m.Mask != 0 {
		return 0, false
	}
	return m.Magic | identity, true
}

// Endpoint is a pod of this node (or the node itself: Identity 1).
type Endpoint struct {
	IP       string `json:"ip"`
	Identity uint32 `json:"identity"`
	// CIDRIdentity is the identity of the longest prefix policies name
	// that holds IP (0: none): rules naming address blocks list it.
	CIDRIdentity uint32 `json:"cidrIdentity,omitempty"`
	Pod          string `json:"pod,omitempty"` // namespace/name
	// Labels of the identity (key=value), for flows.
	Labels []string `json:"labels,omitempty"`
}

// Service is one port of a Service: the proxy may be dialled at VIP:Port
// (the original destination) and routes name it as a backend by
// (Name, Port).
type Service struct {
	Name     string `json:"name"` // namespace/name
	VIP      string `json:"vip,omitempty"`
	Port     uint16 `json:"port"`
	PortName string `json:"portName,omitempty"`
	// External: a NodePort, load balancer or external address of the
	// Service (one per node address), dialled by the node's own clients
	// at VIP:Port; never a route's backend, which names the ClusterIP port.
	External bool      `json:"external,omitempty"`
	Backends []Backend `json:"backends,omitempty"` // ready endpoints
}

// Backend is one ready endpoint of a service port.
type Backend struct {
	IP   string `json:"ip"`
	Port uint16 `json:"port"` // the target port
	Pod  string `json:"pod,omitempty"`
}

// Route is one HTTPRoute or GRPCRoute (gateway.networking.k8s.io/v1) attached to service
// ports (the GAMMA mesh pattern). Several routes on one parent are merged by
// the proxy with the Gateway API's precedence rules.
type Route struct {
	Name string `json:"name"` // namespace/name
	// Kind is GRPCRoute for a GRPCRoute, translated to the same matches
	// (its method is the path "/service/method"); "": an HTTPRoute.
	Kind    string      `json:"kind,omitempty"`
	Created time.Time   `json:"created"`
	Parents []ParentRef `json:"parents"`
	Rules   []RouteRule `json:"rules"`
}

// ParentRef names a parent service port; Port 0 attaches to every port.
type ParentRef struct {
	Service string `json:"service"` // namespace/name
	Port    uint16 `json:"port,omitempty"`
	// Consumer is the route's namespace when it is not the Service's: a
	// consumer route (GAMMA), which applies to clients of that namespace
	// only, and for them replaces the Service's own (producer) routes.
	Consumer string `json:"consumer,omitempty"`
}

// RouteRule is one rule of a route: any of its matches (none: every
// request) sends the request to one of its backends, chosen by weight per
// request.
type RouteRule struct {
	Matches  []Match        `json:"matches,omitempty"`
	Backends []RouteBackend `json:"backends,omitempty"`
	// Timeout bounds the whole request (retries included); 0: none.
	Timeout Duration `json:"timeout,omitempty"`
	Retry   *Retry   `json:"retry,omitempty"`
	// Filters change the request and its response, or answer it with a
	// redirect (nil: none).
	Filters *Filters `json:"filters,omitempty"`
	// Dropped says why the rule matches no request: the agent found a
	// match it cannot compile (Match.Problems). It keeps its place, so
	// the rules after it keep their indexes.
	Dropped string `json:"dropped,omitempty"`
}

// Filters are the Gateway API's HTTPRoute filters the proxy applies: a
// rule's, and a backendRef's (header modifiers only, after the rule's).
type Filters struct {
	RequestHeaders  *HeaderModifier `json:"requestHeaders,omitempty"`
	ResponseHeaders *HeaderModifier `json:"responseHeaders,omitempty"`
	// Redirect answers the request itself; no backend is asked.
	Redirect *Redirect `json:"redirect,omitempty"`
	// Rewrite changes the request's path and Host on their way upstream.
	Rewrite *Rewrite `json:"rewrite,omitempty"`
	// Mirrors each get a copy of the rule's requests (HTTPRequestMirrorFilter;
	// a rule's only, never a backendRef's).
	Mirrors []Mirror `json:"mirrors,omitempty"`
	// Unsupported names a filter the proxy does not implement: the
	// requests of its rule are answered 500 rather than forwarded without
	// it, as the Gateway API asks of a filter that cannot be applied.
	Unsupported string `json:"unsupported,omitempty"`
}

// HeaderModifier is HTTPHeaderFilter: set replaces a header's values,
// add appends a value, remove deletes the header; names are
// case-insensitive.
type HeaderModifier struct {
	Set    []Header `json:"set,omitempty"`
	Add    []Header `json:"add,omitempty"`
	Remove []string `json:"remove,omitempty"`
}

// Header is one header's name and value.
type Header struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Redirect is HTTPRequestRedirectFilter. Empty fields keep the request's
// (its scheme, its Host's name, its path); a zero Port is the scheme's
// well-known port when Scheme is given, else the service port the client
// dialled; the Location leaves out port 80 for http and 443 for https.
type Redirect struct {
	Scheme     string        `json:"scheme,omitempty"`
	Hostname   string        `json:"hostname,omitempty"`
	Path       *PathModifier `json:"path,omitempty"`
	Port       uint16        `json:"port,omitempty"`
	StatusCode int           `json:"statusCode,omitempty"` // default 302
}

// Mirror is HTTPRequestMirrorFilter: a copy of Percent of the rule's
// requests, chosen at random, goes to a backend of the service port, and
// its response is read and thrown away; the client's answer never waits
// for it. A mirror whose backendRef does not resolve is not listed (the
// Gateway API drops it; the route's ResolvedRefs condition says why).
type Mirror struct {
	Service string  `json:"service"` // namespace/name
	Port    uint16  `json:"port"`
	Percent float64 `json:"percent"` // 0-100
}

// Rewrite is HTTPURLRewriteFilter.
type Rewrite struct {
	Hostname string        `json:"hostname,omitempty"`
	Path     *PathModifier `json:"path,omitempty"`
}

// PathModifier is HTTPPathModifier: the whole path, or the part the rule's
// PathPrefix match matched.
type PathModifier struct {
	Type  string `json:"type"` // ReplaceFullPath, ReplacePrefixMatch
	Value string `json:"value"`
}

// Path modifier types, as the Gateway API names them.
const (
	ReplaceFullPath    = "ReplaceFullPath"
	ReplacePrefixMatch = "ReplacePrefixMatch"
)

// Match is the Gateway API HTTPRouteMatch: every field given must match.
type Match struct {
	Path    *PathMatch    `json:"path,omitempty"`
	Method  string        `json:"method,omitempty"`
	Headers []HeaderMatch `json:"headers,omitempty"`
	Query   []HeaderMatch `json:"queryParams,omitempty"`
}

// Path and header match types, as the Gateway API names them.
const (
	MatchExact       = "Exact"
	MatchPathPrefix  = "PathPrefix"
	MatchRegularExpr = "RegularExpression"
)

// PathMatch matches the request path. PathPrefix matches whole path
// elements ("/api" matches "/api/x", not "/apix"); RegularExpression is RE2
// over the whole path and ranks between Exact and PathPrefix (the Gateway
// API leaves its precedence to implementations).
type PathMatch struct {
	Type  string `json:"type"` // Exact, PathPrefix, RegularExpression
	Value string `json:"value"`
}

// HeaderMatch matches a header (values of a repeated header joined by
// ",") or a query parameter (its first value); a RegularExpression is RE2
// over the whole value.
type HeaderMatch struct {
	Type  string `json:"type,omitempty"` // Exact (default), RegularExpression
	Name  string `json:"name"`
	Value string `json:"value"`
}

// RouteBackend is a weighted backendRef. A ref that does not resolve
// (Unresolved says why) keeps its weight: its share of requests is answered
// with 500, as the Gateway API specifies.
type RouteBackend struct {
	Service    string `json:"service"` // namespace/name
	Port       uint16 `json:"port"`
	Weight     int32  `json:"weight"`
	Unresolved string `json:"unresolved,omitempty"`
	// Filters of this backendRef: header modifiers applied after the
	// rule's when this backend is picked (Unsupported: its share of
	// requests is answered 500).
	Filters *Filters `json:"filters,omitempty"`
}

// Retry is the Gateway API HTTPRouteRetry.
type Retry struct {
	Codes    []int    `json:"codes,omitempty"` // statuses retried; connection errors always are
	Attempts int      `json:"attempts,omitempty"`
	Backoff  Duration `json:"backoff,omitempty"`
}

// PortPolicy is the L7 view of one pod port's ingress policy: every rule
// (with or without HTTP rules) that applies to the port, so the proxy can
// decide each request the way the policy reads. A port gets one only when at
// least one of its rules has HTTP rules; L3/L4 admission stays in the tc
// programs.
type PortPolicy struct {
	Endpoint string `json:"endpoint"` // the pod's IP
	Port     uint16 `json:"port"`
	// Isolated: some policy isolates the pod for ingress, so a request no
	// allow rule matches is denied; otherwise only deny rules take away.
	Isolated bool     `json:"isolated,omitempty"`
	Rules    []L7Rule `json:"rules"`
}

// Rule actions.
const (
	ActionAllow = "allow"
	ActionDeny  = "deny"
)

// L7Rule is one policy rule as it applies to a (pod, port): which peers, and
// which of their requests (HTTP nil: all of them).
type L7Rule struct {
	Name       string     `json:"name"` // e.g. ShuntNetworkPolicy ns/name ingress[0] (allow)
	Action     string     `json:"action"`
	AnyPeer    bool       `json:"anyPeer,omitempty"`
	Identities []uint32   `json:"identities,omitempty"`
	CIDRs      []string   `json:"cidrs,omitempty"`  // peers by address (ipBlock cidr)
	Except     []string   `json:"except,omitempty"` // ... minus these
	HTTP       []HTTPRule `json:"http,omitempty"`
	// Builtin: the node's own rule, not a policy's (a refusal's "no rule
	// of ... allows" names policies only).
	Builtin bool `json:"builtin,omitempty"`
}

// HTTPRule matches requests; an empty field matches anything. Path is an
// RE2 regular expression over the whole path; Headers are exact values.
type HTTPRule struct {
	Method  string            `json:"method,omitempty"`
	Path    string            `json:"path,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// Duration is a time.Duration written as Go's duration strings ("1.5s").
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string like \"1.5s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}
