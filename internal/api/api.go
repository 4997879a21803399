// Package api is the agent's local HTTP API over a Unix socket: the request
// and response types and a client for the CLI.
package api

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// Object is a manifest object on the wire, with where it came from so the
// agent's errors can name the file.
type Object struct {
	Source string          `json:"source"`
	Object json.RawMessage `json:"object"`
}

// ObjectsRequest is the body of apply and delete.
type ObjectsRequest struct {
	Objects []Object `json:"objects"`
}

// MaxRequestBytes is the largest request body the agent reads: 64 MiB,
// room for 200 000 ordinary manifest documents (100 000 NetworkPolicies
// encode to 31 MiB). The agent refuses a larger request whole, with 413,
// before it decodes any object; EncodeObjects refuses to build one. It
// bounds what one request can make the agent hold (applying those 100 000
// policies peaks the agent at about 530 MiB, e2e TestHundredThousandDocuments).
const MaxRequestBytes = 64 << 20

// TooLargeError is a request over MaxRequestBytes.
type TooLargeError struct {
	Objects int   // how many objects, when known
	Size    int64 // bytes, when known
}

func (e *TooLargeError) Error() string {
	what := "the request"
	if e.Objects > 0 {
		what = fmt.Sprintf("%d objects encoding to %.1f MiB", e.Objects, float64(e.Size)/(1<<20))
	}
	return fmt.Sprintf("%s: over the agent's limit of %d MiB per request: apply the manifests in parts "+
		"(one `shunt apply -f` per file or folder; each part is applied whole or not at all)", what, MaxRequestBytes>>20)
}

// EncodeObjects encodes an ObjectsRequest whose objects are valid, compact
// JSON already (as manifest documents are): json.Marshal would scan each
// of them again, which for 20 000 documents is a noticeable part of an
// apply. A request over MaxRequestBytes is a *TooLargeError.
func EncodeObjects(objs []Object) (json.RawMessage, error) {
	size := 16
	for _, o := range objs {
		size += len(o.Source) + len(o.Object) + 32
	}
	buf := make([]byte, 0, size)
	buf = append(buf, `{"objects":[`...)
	for i, o := range objs {
		if i > 0 {
			buf = append(buf, ',')
		}
		src, err := json.Marshal(o.Source)
		if err != nil {
			return nil, err
		}
		buf = append(buf, `{"source":`...)
		buf = append(buf, src...)
		buf = append(buf, `,"object":`...)
		buf = append(buf, o.Object...)
		buf = append(buf, '}')
	}
	buf = append(buf, "]}"...)
	if len(buf) > MaxRequestBytes {
		return nil, &TooLargeError{Objects: len(objs), Size: int64(len(buf))}
	}
	return buf, nil
}

// Change says what happened to one object.
type Change struct {
	Key    string `json:"key"`
	Action string `json:"action"`
}

// ChangesResponse answers apply and delete.
type ChangesResponse struct {
	Changes  []Change `json:"changes"`
	Warnings []string `json:"warnings,omitempty"` // accepted, but worth knowing (kubectl prints them)
	// TookMs is how long the agent spent on the request: decoding and
	// checking, programming the datapath, persisting.
	TookMs float64 `json:"tookMs"`
}

// PolicyMap is the decoded content of shunt_policy for one pod.
type PolicyMap struct {
	Pod               string           `json:"pod"`
	IP                string           `json:"ip"`
	Identity          uint32           `json:"identity"`
	IngressIsolatedBy []string         `json:"ingressIsolatedBy,omitempty"`
	EgressIsolatedBy  []string         `json:"egressIsolatedBy,omitempty"`
	Entries           []PolicyMapEntry `json:"entries"`
}

// PolicyMapEntry is one policy map entry, decoded.
type PolicyMapEntry struct {
	Direction string `json:"direction"`
	Identity  uint32 `json:"identity"`
	Peer      string `json:"peer"`  // what the identity stands for
	Ports     string `json:"ports"` // e.g. 80/TCP, 8000-8063/TCP, all/UDP, any
	Verdict   string `json:"verdict"`
	RuleID    uint32 `json:"ruleID"`
	Rule      string `json:"rule,omitempty"`
}

// Status is the agent's summary.
type Status struct {
	Instance string `json:"instance"`
	NodeName string `json:"nodeName"`
	PID      int    `json:"pid"`
	Source   string `json:"source"` // where objects come from: "lab" or "kubernetes https://..."
	// Problems are what objects ask that shunt leaves out (the rest is
	// programmed): "Kind ns/name: what and why".
	Problems   []string          `json:"problems,omitempty"`
	Mode       string            `json:"mode"`
	Routing    *RoutingStatus    `json:"routing,omitempty"`    // nil: pods of other nodes are the host stack's
	Tunnel     *TunnelStatus     `json:"tunnel,omitempty"`     // nil: no overlay
	Masquerade *MasqueradeStatus `json:"masquerade,omitempty"` // nil: pods' traffic keeps their addresses
	// ExternalByKubeProxy: NodePorts, load balancer addresses and
	// externalIPs are left to kube-proxy (--kube-proxy-replacement=false).
	ExternalByKubeProxy bool `json:"externalByKubeProxy,omitempty"`
	// NodePortMode is how flows from outside the cluster reach backends
	// on other nodes (dpinfo.NodePortMode: snat, dsr or hybrid); "" when
	// the node serves no client from outside (no underlay address, or
	// kube-proxy serves them).
	NodePortMode string           `json:"nodePortMode,omitempty"`
	PodCIDR      string           `json:"podCIDR"`
	ServiceCIDR  string           `json:"serviceCIDR"`
	NodeIP       string           `json:"nodeIP"`
	PinDir       string           `json:"pinDir"`
	Pods         int              `json:"pods"`
	Counters     []dpinfo.Counter `json:"counters"`

	Started  time.Time           `json:"started"`
	Health   []string            `json:"health"` // "ok", or what needs attention
	Features []string            `json:"features"`
	Kernel   dpinfo.KernelReport `json:"kernel"` // the kernel's release and the fallbacks taken
	Hooks    map[string]int      `json:"hooks"`  // attached programs by hook
	// ProgramStats are the programs' runs and run time by hook, while the
	// kernel counts them (ProgramStatsOn: shuntd --bpf-stats, or
	// kernel.bpf_stats_enabled=1).
	ProgramStats   []dpinfo.ProgramStat `json:"programStats,omitempty"`
	ProgramStatsOn bool                 `json:"programStatsOn"`
	Maps           []dpinfo.MapInfo     `json:"maps"`
	FlowSampling   string               `json:"flowSampling"`
	Flows          FlowStatus           `json:"flows"`
	MetricsAddr    string               `json:"metricsAddr,omitempty"`
	Proxy          *ProxyStatus         `json:"proxy,omitempty"`
	Accel          AccelStatus          `json:"socketAcceleration"`
	Drift          *DriftStatus         `json:"drift,omitempty"` // drift checks of the maps (drift.go)
}

// TunnelStatus is the node's overlay: how pods of other nodes are reached.
type TunnelStatus struct {
	Kind     string `json:"kind"`     // vxlan
	Device   string `json:"device"`   // the collect-metadata device
	Underlay string `json:"underlay"` // this node's address other nodes tunnel to
	PodMTU   int    `json:"podMTU"`   // the underlay's MTU less the encapsulation
}

// RoutingStatus is how pods of other nodes are reached: through the
// overlay (Tunnel says how) or routed natively, as they are, out of the
// underlay interface.
type RoutingStatus struct {
	Mode     string `json:"mode"`     // tunnel or native
	Device   string `json:"device"`   // what pods' packets for other nodes leave through
	Underlay string `json:"underlay"` // this node's address other nodes reach it at
	PodMTU   int    `json:"podMTU"`   // pod interfaces' MTU
	// Peers are the other nodes whose pods are reached this way.
	Peers []Peer `json:"peers,omitempty"`
}

// Peer is another node as this one reaches it.
type Peer struct {
	Node    string `json:"node"`
	Address string `json:"address"` // its underlay address ("": none, its pods are unreachable)
	PodCIDR string `json:"podCIDR"`
	Ready   bool   `json:"ready"`
}

// MasqueradeStatus is how pods' traffic to outside the cluster leaves the
// node.
type MasqueradeStatus struct {
	Uplink  string   `json:"uplink"`  // the interface holding Address, where the programs run
	Address string   `json:"address"` // the node's address flows leave from
	Ports   string   `json:"ports"`   // MIN-MAX
	Exclude []string `json:"exclude"` // destinations left alone (besides what the ipcache knows)
}

// AccelStatus says whether socket acceleration is on and how many sockets
// it holds.
type AccelStatus struct {
	Enabled bool `json:"enabled"`
	// NodeProcesses: the node's own processes take part, not only pods
	// and the node proxy.
	NodeProcesses bool `json:"nodeProcesses"`
	Sockets       int  `json:"sockets"`
	// Caveat is what acceleration does differently on this node's kernel
	// (FIONREAD before tcp_bpf_ioctl, no backpressure), "" when nothing.
	Caveat string `json:"caveat,omitempty"`
	// Refused is why acceleration the agent was started with is off (a
	// kernel without backpressure), "" when it was not refused.
	Refused string `json:"refused,omitempty"`
}

// ProxyStatus is the node L7 proxy as the agent sees it.
type ProxyStatus struct {
	Listen        string `json:"listen"`
	PID           int    `json:"pid,omitempty"`
	Healthy       bool   `json:"healthy"`
	Version       uint64 `json:"version"`       // of the configuration in force
	WantedVersion uint64 `json:"wantedVersion"` // the latest the agent computed
	Routes        int    `json:"routes"`
	Policies      int    `json:"policies"` // pod ports with HTTP rules
	Redirected    int    `json:"redirected"`
	Requests      uint64 `json:"requests"`
	Active        int64  `json:"activeConnections"`
	Error         string `json:"error,omitempty"`
}

// FlowStatus says how flow reporting fares.
type FlowStatus struct {
	Emitted        uint64 `json:"emitted"`
	Lost           uint64 `json:"lost"` // ring buffer full
	History        int    `json:"history"`
	FollowerMissed uint64 `json:"followerMissed"`
}

// ServiceEntry is one decoded service port of the datapath's maps.
type ServiceEntry struct {
	Service  string   `json:"service"` // ns/name:port, from the agent's state
	VIP      string   `json:"vip"`
	Port     uint16   `json:"port"`
	Protocol string   `json:"protocol"`
	ID       uint32   `json:"id"`
	Affinity uint32   `json:"affinityTimeoutSeconds,omitempty"`
	Backends []string `json:"backends"` // ip:port (backend id)
}

// Error is the body of every failed request.
type Error struct {
	Error string `json:"error"`
}

// UnreachableError is a request that never reached the agent.
type UnreachableError struct {
	Socket string
	Err    error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach the shunt agent at %s (is it running? `shunt lab up` starts it): %v", e.Socket, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// StatusError is a request the agent answered with a failure.
type StatusError struct {
	Code int // HTTP status
	Msg  string
}

func (e *StatusError) Error() string { return e.Msg }

// Client talks to one agent (or to a relay, which answers the same flows
// requests).
type Client struct {
	socket string // where it is reached, for errors: a socket path or an address
	base   string // the URL requests go to, before the path
	http   *http.Client
}

// NewClient returns a client for the agent listening on socket.
func NewClient(socket string) *Client {
	return &Client{socket: socket, base: "http://shuntd", http: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}}
}

// NewRemoteClient returns a client for an agent's (or a relay's) TCP
// listener at addr (host:port): HTTPS with tlsConfig (a client certificate
// and the CA that signed the server's), plain HTTP when tlsConfig is nil
// (loopback only: the server refuses anything else without TLS).
func NewRemoteClient(addr string, tlsConfig *tls.Config) *Client {
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
	}
	return &Client{socket: addr, base: scheme + "://" + addr, http: &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}}}
}

// Do sends a request and decodes the JSON answer into out (if not nil).
// in is encoded as JSON, unless it is a json.RawMessage: that is sent as
// it is.
func (c *Client) Do(method, path string, in, out any) error {
	return c.DoContext(context.Background(), method, path, in, out)
}

// DoContext is Do bounded by ctx.
func (c *Client) DoContext(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if raw, ok := in.(json.RawMessage); ok {
		body = bytes.NewReader(raw)
	} else if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if errors.Is(err, os.ErrPermission) {
		return fmt.Errorf("permission denied on the agent's socket %s: it is root-only, run shunt as root", c.socket)
	}
	if err != nil {
		return &UnreachableError{Socket: c.socket, Err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		var e Error
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			return &StatusError{Code: resp.StatusCode, Msg: e.Error}
		}
		return &StatusError{Code: resp.StatusCode, Msg: fmt.Sprintf("agent answered %s: %s", resp.Status, data)}
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// Stream GETs path and calls each for every line of the answer (JSON lines)
// until the agent ends it or each returns an error.
func (c *Client) Stream(path string, each func(line []byte) error) error {
	return c.StreamContext(context.Background(), path, each)
}

// StreamContext is Stream until ctx ends.
func (c *Client) StreamContext(ctx context.Context, path string, each func(line []byte) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if errors.Is(err, os.ErrPermission) {
		return fmt.Errorf("permission denied on the agent's socket %s: it is root-only, run shunt as root", c.socket)
	}
	if err != nil {
		return &UnreachableError{Socket: c.socket, Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		data, _ := io.ReadAll(resp.Body)
		var e Error
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			return fmt.Errorf("%s", e.Error)
		}
		return fmt.Errorf("agent answered %s: %s", resp.Status, data)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if err := each(sc.Bytes()); err != nil {
			return err
		}
	}
	return sc.Err()
}

// Alive says whether an agent answers on the socket.
func (c *Client) Alive() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://shuntd/v1/status", nil)
	resp, err := c.http.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Network is the node's pod network as the CNI plugin needs it to plumb a
// pod (GET /v1/network): where addresses come from (the node's
// spec.podCIDR), the gateway, what pods route through the node.
type Network struct {
	PodCIDR      string `json:"podCIDR"`
	NodeIP       string `json:"nodeIP"` // the pods' gateway
	ServiceCIDR  string `json:"serviceCIDR"`
	ClusterCIDR  string `json:"clusterCIDR,omitempty"`  // every node's pods: routed through the node too
	DefaultRoute bool   `json:"defaultRoute,omitempty"` // pods route everything through the node (Kubernetes, masquerade, an uplink)
	Mode         string `json:"mode"`
	Bridge       bool   `json:"bridge"` // pods join NodeIf (a bridge) instead of being routed
	NodeIf       string `json:"nodeIf"`
	MTU          int    `json:"mtu,omitempty"`
	// LinkAliasPrefix is set (with the pod's name) on pod veths, so the
	// instance's uninstall finds them without any state.
	LinkAliasPrefix string `json:"linkAliasPrefix"`
}

// Endpoint is a local pod's interface as a CNI ADD built it
// (PUT /v1/endpoints/{namespace}/{name}); the agent answers once the
// datapath has programmed it.
type Endpoint struct {
	Pod         string `json:"pod,omitempty"` // namespace/name (set in answers)
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"` // in the pod
	Netns       string `json:"netns"`
	IP          string `json:"ip"`
	HostIf      string `json:"hostIf"`
	Ifindex     int    `json:"ifindex"`
	PodMAC      string `json:"podMAC"`
	NodeMAC     string `json:"nodeMAC"`
	Cgroup      string `json:"cgroup,omitempty"` // the pod's cgroup directory, if the runtime said
	CgroupID    uint64 `json:"cgroupID,omitempty"`
}

// Health is the answer of GET /v1/healthz: the agent takes endpoints.
type Health struct {
	Status string `json:"status"`
}
