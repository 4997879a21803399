package datapath

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"
)

// The per-packet cost of the tc programs (issues 27 and 31): each case
// runs one program with BPF_PROG_TEST_RUN on a crafted packet of a flow
// the maps already hold, as a node of `bench/run nodeport` holds it: the
// NodePort test node (lib/nodeport.h's tests) with 10 000 other ClusterIP
// Services of ten backends each in the service maps. The time is the
// kernel's own measurement of one run (BPF_PROG_TEST_RUN's duration with
// repeat 1: the program and the helpers it calls, plus one ktime read),
// not the syscall around it; ns/pkt is the median of b.N runs, so a run
// an interrupt landed in does not move it. Repeat > 1 would run the
// program again on the packet it already rewrote (TTL, NAT), another path.
//
// Run: nice -n 19 go test -run '^$' -bench BenchmarkPacketCost -benchtime 20000x ./internal/datapath/

// benchServices is how many ClusterIP Services (ten backends each) fill
// the service maps, as bench/run nodeport's N.
const benchServices = 10000

// Addresses of the cost node beside the NodePort test node's (npNode,
// npLocalPod, npRemotePod, ...): a second local pod, the client side of
// pod-to-pod flows.
var costClientPod = netip.MustParseAddr("10.99.0.11")

const costClientID, costServerID, costRemoteID = 300, 302, 301

// progRun runs prog once on data (ctx: the __sk_buff it starts with, nil
// for none) and returns its verdict and the kernel's time for the run.
// cilium/ebpf gives the duration only without a context, so this is the
// BPF_PROG_TEST_RUN syscall itself (union bpf_attr's test member).
func progRun(prog *ebpf.Program, data, ctx []byte) (uint32, uint32, error) {
	var attr struct {
		progFD, retval, dataSizeIn, dataSizeOut uint32
		dataIn, dataOut                         uint64
		repeat, duration                        uint32
		ctxSizeIn, ctxSizeOut                   uint32
		ctxIn, ctxOut                           uint64
		flags, cpu, batchSize, _                uint32
	}
	attr.progFD = uint32(prog.FD())
	attr.dataSizeIn = uint32(len(data))
	attr.dataIn = uint64(uintptr(unsafe.Pointer(&data[0])))
	attr.repeat = 1
	if len(ctx) > 0 {
		attr.ctxSizeIn = uint32(len(ctx))
		attr.ctxIn = uint64(uintptr(unsafe.Pointer(&ctx[0])))
	}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_TEST_RUN, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(data)
	runtime.KeepAlive(ctx)
	if errno != 0 {
		return 0, 0, fmt.Errorf("BPF_PROG_TEST_RUN of %s: %w", prog, errno)
	}
	return attr.retval, attr.duration, nil
}

// costNode is the NodePort test node, its flows set up and its maps
// filled, whose programs the benchmarks run.
type costNode struct {
	d      *Datapath
	ns     string
	uplink int
}

// run runs prog on pkt (its checksums made valid) in the node's namespace
// and fails unless the verdict is want: a benchmark must measure the path
// it names, not a drop.
func (n *costNode) run(tb testing.TB, prog *ebpf.Program, pkt, ctx []byte, want uint32) []byte {
	tb.Helper()
	var ret uint32
	out := make([]byte, len(pkt)+256)
	if err := netnsrun.Do(n.ns, func() error {
		var err error
		ret, err = prog.Run(&ebpf.RunOptions{Data: withChecksum(pkt), DataOut: out, Context: ctx})
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	if ret != want {
		tb.Fatalf("%s on %x: verdict %d, want %d", prog, pkt[14:], ret, want)
	}
	return out[:len(pkt)]
}

// newCostNode lays out the NodePort test node (native routing, or the
// VXLAN overlay with tunnel), its two local pods and the other node's pod,
// flows in the default sampling (what an agent runs with: no event for a
// packet of a known connection), and benchServices Services.
func newCostNode(b *testing.B, tunnel bool) *costNode {
	d, ns, uplink := nodePortTestNodeRouted(b, 0, dpinfo.NodePortSNAT, nil, tunnel)
	// Test runs see packets arrive on lo: the pods' veth, which forwards
	// as the agent sets pods' veths (bpf_fib_lookup refuses a device
	// that does not).
	if err := netnsrun.Do(ns, func() error {
		out, err := exec.Command("sysctl", "-qw", "net.ipv4.conf.lo.forwarding=1").CombinedOutput()
		if err != nil {
			return fmt.Errorf("sysctl: %w: %s", err, out)
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	// The server pod has ingress rules (admitting the client pod and the
	// node), so a new connection to it is judged by the policy map.
	state := policy.State{
		IPCache: []policy.PrefixIdentity{
			{Prefix: netip.PrefixFrom(npLocalPod, 32), Identity: costServerID},
			{Prefix: netip.PrefixFrom(costClientPod, 32), Identity: costClientID},
			{Prefix: netip.PrefixFrom(npRemotePod, 32), Identity: costRemoteID, Tunnel: npOtherNode},
			{Prefix: netip.PrefixFrom(npSNAT, 32), Identity: policy.IdentityHost},
			{Prefix: netip.PrefixFrom(npNode, 32), Identity: policy.IdentityHost},
		},
		Entries: []policy.Entry{
			{Key: policy.Key{Endpoint: npLocalPod, Identity: costClientID}, Verdict: policy.VerdictAllow, RuleID: 1},
			{Key: policy.Key{Endpoint: npLocalPod, Identity: policy.IdentityHost}, Verdict: policy.VerdictAllow, RuleID: 2},
			{Key: policy.Key{Endpoint: npLocalPod, Identity: policy.IdentityWorld}, Verdict: policy.VerdictAllow, RuleID: 3},
		},
	}
	if err := d.SyncPolicy(state, []Endpoint{
		{IP: npLocalPod, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: costServerID, IngressRules: true},
		{IP: costClientPod, Ifindex: 1, PodMAC: mac, NodeMAC: mac, Identity: costClientID},
	}); err != nil {
		b.Fatal(err)
	}
	if err := d.SetFlowMode(FlowModeDefault); err != nil {
		b.Fatal(err)
	}
	ports := []services.Port{
		{Frontend: services.Frontend{VIP: npNode, Port: 30080, Proto: 6}, Kind: services.KindNodePort, Name: "local",
			Backends: []services.Backend{{IP: npLocalPod, Port: 8080}}},
		{Frontend: services.Frontend{VIP: npNode, Port: 30081, Proto: 6}, Kind: services.KindNodePort, Name: "remote",
			Backends: []services.Backend{{IP: npRemotePod, Port: 8080}}},
	}
	for i := range benchServices {
		vip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		p := services.Port{Frontend: services.Frontend{VIP: vip, Port: 80, Proto: 6}, Kind: services.KindClusterIP,
			Name: fmt.Sprintf("bench/svc-%d:80", i)}
		for j := range 10 {
			p.Backends = append(p.Backends, services.Backend{IP: netip.AddrFrom4([4]byte{10, 98, 1, byte(j + 1)}), Port: 8080})
		}
		ports = append(ports, p)
	}
	if _, err := d.SyncServices(ports); err != nil {
		b.Fatal(err)
	}
	return &costNode{d: d, ns: ns, uplink: uplink}
}

// costCase is one packet of an established flow (or a new one's SYN with
// newConn: its source port changes every run) and the verdict its program
// gives it.
type costCase struct {
	name    string
	prog    *ebpf.Program
	pkt     []byte
	ctx     []byte
	verdict uint32
	newConn bool
}

// measure runs c b.N times and reports the median and mean kernel time of
// one run.
func (n *costNode) measure(b *testing.B, c costCase) {
	pkt := withChecksum(slices.Clone(c.pkt))
	sport := binary.BigEndian.Uint16(pkt[34:])
	times := make([]uint32, 0, b.N)
	var flows *FlowReader
	if c.newConn {
		// Each new connection sends a flow event: drained as the
		// agent drains them, so the ring buffer never fills (a full
		// buffer makes the output fail early, cheaper than real).
		var err error
		if flows, err = n.d.Flows(); err != nil {
			b.Fatal(err)
		}
		defer flows.Close()
		go func() {
			for flows.r.ReadInto(&flows.rec) == nil {
			}
		}()
	}
	b.ResetTimer()
	err := netnsrun.Do(n.ns, func() error {
		for i := range b.N {
			if c.newConn {
				binary.BigEndian.PutUint16(pkt[34:], sport+uint16(i%50000))
			}
			ret, ns, err := progRun(c.prog, pkt, c.ctx)
			if err != nil {
				return err
			}
			if ret != c.verdict {
				return fmt.Errorf("%s: run %d: verdict %d, want %d", c.name, i, ret, c.verdict)
			}
			times = append(times, ns)
		}
		return nil
	})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	var sum uint64
	for _, t := range times {
		sum += uint64(t)
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2]), "ns/pkt")
	b.ReportMetric(float64(sum)/float64(len(times)), "mean-ns/pkt")
}

// established opens a TCP connection through the programs as its packets
// would cross them (SYN, SYN-ACK, ACK: tracked and assured) and returns
// the case of its client's next packet.
// The server answers from replyFrom: the server's own address, or the
// backend's behind a translated frontend.
func (n *costNode) established(b *testing.B, name string, out, back *ebpf.Program, outCtx, backCtx []byte,
	client, server, replyFrom netip.AddrPort, outVerdict, backVerdict uint32) costCase {
	c, s, r := client.Addr(), server.Addr(), replyFrom.Addr()
	n.run(b, out, packet(c, s, 6, tcpSegment(client.Port(), server.Port(), tcpSYN)), outCtx, outVerdict)
	n.run(b, back, packet(r, c, 6, tcpSegment(replyFrom.Port(), client.Port(), tcpSYNACK)), backCtx, backVerdict)
	ack := packet(c, s, 6, tcpSegment(client.Port(), server.Port(), tcpACK))
	n.run(b, out, ack, outCtx, outVerdict)
	return costCase{name: name, prog: out, pkt: ack, ctx: outCtx, verdict: outVerdict}
}

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// BenchmarkPacketCost measures the tc programs' cost per packet of an
// established TCP flow on each path, and of a new connection's SYN.
func BenchmarkPacketCost(b *testing.B) {
	for _, routing := range []string{"native", "overlay"} {
		b.Run(routing, func(b *testing.B) {
			n := newCostNode(b, routing == "overlay")
			fromPod, toPod, fromUplink := n.d.objs.ShuntFromPod, n.d.objs.ShuntToPod, n.d.uplink.ShuntFromUplink
			uplinkCtx, podCtx := skbContext(n.uplink), skbContext(1)
			remoteVerdict := uint32(tcActRedirect) // to_node_routed and to_tunnel both redirect
			cases := []costCase{
				n.established(b, "from-pod/to-local-pod", fromPod, fromPod, podCtx, podCtx,
					ap(costClientPod, 40000), ap(npLocalPod, 8080), ap(npLocalPod, 8080), tcActRedirect, tcActRedirect),
				// The other node's answers cross shunt_to_pod here
				// (as after the overlay's or the uplink's program).
				n.established(b, "from-pod/to-remote-pod", fromPod, toPod, podCtx, podCtx,
					ap(costClientPod, 40001), ap(npRemotePod, 8080), ap(npRemotePod, 8080), remoteVerdict, tcActOK),
				// The node (its proxy's upstream connection, a
				// kubelet probe) to a pod: what the pod's veth runs.
				n.established(b, "to-pod/from-node", toPod, fromPod, podCtx, podCtx,
					ap(npSNAT, 40002), ap(npLocalPod, 8080), ap(npLocalPod, 8080), tcActOK, tcActOK),
			}
			if routing == "native" {
				// A client outside through a NodePort of this node, to
				// the pod here (the pod's answers to the client leave
				// by shunt_from_pod).
				c := n.established(b, "from-uplink/nodeport-local-backend", fromUplink, fromPod, uplinkCtx, podCtx,
					ap(npClient, 40003), ap(npNode, 30080), ap(npLocalPod, 8080), tcActRedirect, tcActRedirect)
				cases = append(cases, c)
			} else {
				// Another node's VXLAN packet for a pod here, as it
				// reaches the uplink before the VXLAN device: passed
				// at the first look (overlay_arrival).
				cases = append(cases, costCase{name: "from-uplink/overlay-arrival", prog: fromUplink, ctx: uplinkCtx, verdict: tcActOK,
					pkt: packet(npOtherNode, npNode, 17, udpDatagram(50000, ovPort))})
			}
			syn := costCase{name: "from-pod/new-connection-syn", prog: fromPod, ctx: podCtx, verdict: tcActRedirect, newConn: true,
				pkt: packet(costClientPod, npLocalPod, 6, tcpSegment(1024, 8080, tcpSYN))}
			cases = append(cases, syn)
			for _, c := range cases {
				b.Run(c.name, func(b *testing.B) { n.measure(b, c) })
			}
		})
	}
}
