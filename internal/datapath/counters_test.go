package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/policy"
	"github.com/shuntnet/shunt/internal/services"
)

// The tests below check that every outcome of the socket hooks, and every
// map insert that fails in any program, is counted under its own reason and
// named in the flow events. A failed insert is forced with a map that can
// fill: the LRU maps evict instead of failing, so the test loads them as a
// plain hash of a few entries, filled before the test starts.

// counts are the counters by "reason/direction".
func counts(t *testing.T, d *Datapath) map[string]uint64 {
	t.Helper()
	cs, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, c := range cs {
		out[c.Reason+"/"+c.Direction] = c.Packets
	}
	return out
}

// counterDelta checks how much counters moved since before: exactly for
// want, at least once for atLeastOnce.
func counterDelta(t *testing.T, d *Datapath, before map[string]uint64, want map[string]uint64, atLeastOnce ...string) {
	t.Helper()
	after := counts(t, d)
	for k, n := range want {
		if got := after[k] - before[k]; got != n {
			t.Errorf("counter %s moved by %d, want %d (all: %v)", k, got, n, after)
		}
	}
	for _, k := range atLeastOnce {
		if after[k] == before[k] {
			t.Errorf("counter %s did not move (all: %v)", k, after)
		}
	}
}

// smallHash makes the named maps plain hashes of n entries: full maps make
// inserts fail, where an LRU map would evict.
func smallHash(n uint32, names ...string) func(*ebpf.CollectionSpec) {
	return func(spec *ebpf.CollectionSpec) {
		for _, name := range names {
			if m, ok := spec.Maps[name]; ok {
				m.Type, m.MaxEntries = ebpf.Hash, n
			}
		}
	}
}

// fill puts entries with keys no test traffic uses until m is full.
func fill[K any, V any](t *testing.T, m *ebpf.Map, key func(i int) K) {
	t.Helper()
	var v V
	for i := range int(m.MaxEntries()) {
		if err := m.Put(key(i), v); err != nil {
			t.Fatalf("filling the map: %v", err)
		}
	}
}

// flowReader reads the flow events emitted so far.
func flowReader(t *testing.T, d *Datapath) func() []FlowEvent {
	t.Helper()
	if err := d.SetFlowMode(FlowModeDefault); err != nil {
		t.Fatal(err)
	}
	fr, err := d.Flows()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fr.Close() })
	return func() []FlowEvent {
		t.Helper()
		var out []FlowEvent
		for {
			fr.r.SetDeadline(time.Now().Add(50 * time.Millisecond))
			if err := fr.r.ReadInto(&fr.rec); err != nil {
				return out
			}
			e, err := decodeFlow(fr.rec.RawSample, fr.boot)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, e)
		}
	}
}

// expectFlow checks that one of evs has this verdict and reason.
func expectFlow(t *testing.T, evs []FlowEvent, verdict, reason string) {
	t.Helper()
	for _, e := range evs {
		if e.Verdict == verdict && e.Reason == reason {
			return
		}
	}
	t.Errorf("no %s flow event with reason %s among %+v", verdict, reason, evs)
}

// TestSocketHookCounters: every decision of the socket hooks is counted
// for its hook: translated and refused connects, connects and datagrams
// that are no service's, replies and getpeername given back the service
// address; translations and refusals are flow events with the same reason.
// A refused connect fails with ECONNREFUSED, or EPERM without
// bpf_set_retval.
func TestSocketHookCounters(t *testing.T) {
	forEachRefusalMode(t, testSocketHookCounters)
}

// refusalMode is how the socket hooks give a refusal's error: with
// bpf_set_retval (Linux 5.18+), or without it (the no-set-retval fallback),
// where every refusal is EPERM.
type refusalMode struct {
	fallbacks dpinfo.Fallbacks
	// the errors of a service without backends, and of a UDP destination
	// whose replies nothing could give the service address back
	noBackends, noRecord syscall.Errno
}

func forEachRefusalMode(t *testing.T, test func(*testing.T, refusalMode)) {
	for name, m := range map[string]refusalMode{
		"set_retval":    {nil, syscall.ECONNREFUSED, syscall.ENOBUFS},
		"no-set-retval": {dpinfo.Fallbacks{dpinfo.FallbackNoSetRetval: true}, syscall.EPERM, syscall.EPERM},
	} {
		t.Run(name, func(t *testing.T) { test(t, m) })
	}
}

func testSocketHookCounters(t *testing.T, m refusalMode) {
	d := openConfiguredDatapath(t, Config{Mode: ModeRedirectPeer, Fallbacks: m.fallbacks}, nil)
	cg := testCgroup(t)
	if err := d.AttachSocketLB(cg); err != nil {
		t.Fatal(err)
	}
	read := flowReader(t, d)
	c := startSockClient(t, cg, "")
	udp := c.listen("a", "127.0.0.2:0")
	tcp := listenTCP(c, "127.0.0.3:0")
	web, empty := netip.MustParseAddrPort("10.96.213.80:80"), netip.MustParseAddrPort("10.96.213.81:80")
	syncSockServices(t, d, 0, web, tcp, empty, udp)

	before := counts(t, d)
	if ans, want := c.do("tcp %s", web), "ok "+web.String(); ans != want {
		t.Errorf("TCP connect to a service: %q, want %q (getpeername gives the service back)", ans, want)
	}
	counterDelta(t, d, before, map[string]uint64{"sock-translated/connect": 1}, "sock-restored/getpeername")

	before = counts(t, d)
	if ans, want := c.do("tcp %s", empty), "err "+unix.ErrnoName(m.noBackends); ans != want {
		t.Errorf("TCP connect to a service without endpoints: %q, want %q", ans, want)
	}
	counterDelta(t, d, before, map[string]uint64{"sock-refused/connect": 1, "sock-translated/connect": 0})

	before = counts(t, d)
	if ans, want := c.do("tcp %s", tcp), "ok "+tcp.String(); ans != want {
		t.Errorf("TCP connect to the backend itself: %q, want %q", ans, want)
	}
	counterDelta(t, d, before, map[string]uint64{"sock-passed/connect": 1, "sock-translated/connect": 0}, "sock-passed/getpeername")

	before = counts(t, d)
	c.expect(udp, "sendto u %s", testDNSVIP)
	c.expect(udp, "dial s4 4 %s", testDNSVIP)
	c.expect(udp, "dial s6 6 %s", testDNSVIP)
	counterDelta(t, d, before, map[string]uint64{"sock-translated/sendmsg": 1, "sock-translated/connect": 2},
		"sock-restored/recvmsg", "sock-passed/sendmsg") // the echo server's replies are no service's

	evs := read()
	expectFlow(t, evs, "TRANSLATED", "sock-translated")
	expectFlow(t, evs, "DROPPED", "sock-refused")
	for _, e := range evs {
		if e.Point != "socket" {
			t.Errorf("socket hook event at point %q: %+v", e.Point, e)
		}
	}
}

// TestSocketHookInsertFailures: a reverse-NAT entry, an affinity entry or a
// socket's translation record that cannot be made is counted under its own
// reason and named in the flow event. A UDP destination whose replies
// nothing could give the service address back is refused (ENOBUFS) rather
// than left to time out (EPERM without bpf_set_retval); what still works
// goes on.
func TestSocketHookInsertFailures(t *testing.T) {
	forEachRefusalMode(t, testSocketHookInsertFailures)
}

func testSocketHookInsertFailures(t *testing.T, m refusalMode) {
	d := openConfiguredDatapath(t, Config{Mode: ModeRedirectPeer, Fallbacks: m.fallbacks}, smallHash(4, "shunt_revnat", "shunt_affinity"))
	fill[sockaddrRevnatKey, sockaddrRevnatValue](t, d.sockAddr.ShuntRevnat, func(i int) sockaddrRevnatKey {
		return sockaddrRevnatKey{NetnsCookie: uint64(i) + 1, SockCookie: 1}
	})
	fill[sockaddrAffinityKey, sockaddrAffinityValue](t, d.sockAddr.ShuntAffinity, func(i int) sockaddrAffinityKey {
		return sockaddrAffinityKey{ClientCookie: 1, ServiceId: 1<<30 + uint32(i)}
	})
	cg := testCgroup(t)
	if err := d.AttachSocketLB(cg); err != nil {
		t.Fatal(err)
	}
	read := flowReader(t, d)
	c := startSockClient(t, cg, "")
	udp := c.listen("a", "127.0.0.2:0")
	tcp := listenTCP(c, "127.0.0.3:0")
	web := netip.MustParseAddrPort("10.96.213.80:80")
	syncSockServices(t, d, 0, web, tcp, netip.AddrPort{}, udp)

	// Unconnected UDP: only the reverse-NAT entry could restore the
	// service address of replies.
	before := counts(t, d)
	if ans, want := c.do("sendto u %s", testDNSVIP), "err "+unix.ErrnoName(m.noRecord); ans != want {
		t.Errorf("unconnected UDP with the reverse-NAT map full: %q, want %q", ans, want)
	}
	counterDelta(t, d, before, map[string]uint64{"revnat-insert-failed/sendmsg": 1, "sock-translated/sendmsg": 0})
	expectFlow(t, read(), "DROPPED", "revnat-insert-failed")

	// Connected UDP: the socket's own record restores it.
	before = counts(t, d)
	c.expect(udp, "dial s4 4 %s", testDNSVIP)
	counterDelta(t, d, before, map[string]uint64{"revnat-insert-failed/connect": 1, "sock-translated/connect": 1},
		"sock-restored/recvmsg")
	expectFlow(t, read(), "TRANSLATED", "revnat-insert-failed")

	// ClientIP affinity that cannot be recorded: the connection still goes
	// to a backend.
	syncSockServices(t, d, 30, web, tcp, netip.AddrPort{}, udp)
	before = counts(t, d)
	if ans, want := c.do("tcp %s", web), "ok "+web.String(); ans != want {
		t.Errorf("TCP connect with the affinity map full: %q, want %q", ans, want)
	}
	counterDelta(t, d, before, map[string]uint64{"affinity-insert-failed/connect": 1, "sock-translated/connect": 1})
	expectFlow(t, read(), "TRANSLATED", "affinity-insert-failed")

	// A namespace where sockets may not charge socket storage: connect
	// records nothing on the socket.
	ns := testNetns(t)
	if err := netnsrun.Do(ns, func() error { return os.WriteFile("/proc/sys/net/core/optmem_max", []byte("1"), 0o644) }); err != nil {
		// The checks above ran and count; a skip here would report the
		// whole test as not run (Linux 6.1 in make test-kernel-6.1).
		t.Logf("the socket-storage checks are not run on this kernel: cannot lower optmem_max in a network namespace (per-namespace since Linux 6.9): %v", err)
		return
	}
	syncSockServices(t, d, 0, web, tcp, netip.AddrPort{}, udp)
	nc := startSockClient(t, cg, ns)
	nudp := nc.listen("a", udp.String())
	ntcp := listenTCP(nc, tcp.String())
	before = counts(t, d)
	// TCP works; getpeername shows the backend, as nothing remembers the
	// service.
	if ans, want := nc.do("tcp %s", web), "ok "+ntcp.String(); ans != want {
		t.Errorf("TCP connect without socket storage: %q, want %q", ans, want)
	}
	counterDelta(t, d, before, map[string]uint64{"sock-storage-failed/connect": 1, "sock-translated/connect": 1})
	expectFlow(t, read(), "TRANSLATED", "sock-storage-failed")
	// Connected UDP without either record: refused.
	before = counts(t, d)
	if ans, want := nc.do("dial s4 4 %s", testDNSVIP), "err "+unix.ErrnoName(m.noRecord); ans != want {
		t.Errorf("connected UDP without socket storage and reverse-NAT entry: %q, want %q (backend %s)", ans, want, nudp)
	}
	counterDelta(t, d, before, map[string]uint64{"sock-storage-failed/connect": 1, "revnat-insert-failed/connect": 1,
		"sock-translated/connect": 0})
}

// TestTCInsertFailures: on the tc path, a flow whose translation cannot be
// recorded is dropped as nat-insert-failed (not as an invalid packet) and
// leaves no half entry; an affinity entry that cannot be recorded is
// counted and named while the packet goes on; a connection conntrack
// cannot record is dropped as ct-full even though policy allows it (fail
// closed); an assured connection that cannot move to shunt_ct is counted
// and named as ct-promote-failed, stays in shunt_ct_new and goes on.
func TestTCInsertFailures(t *testing.T) {
	d := openChangedDatapath(t, ModeRedirectPeer, smallHash(2, "shunt_tc_nat", "shunt_affinity", "shunt_ct", "shunt_ct_new"))
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	client, backend := netip.MustParseAddr("10.99.0.10"), netip.MustParseAddr("10.99.0.11")
	vip := netip.MustParseAddr("10.96.0.10")
	if err := d.SyncPolicy(policy.State{}, []Endpoint{
		{IP: client, Ifindex: 1, PodMAC: mac, NodeMAC: mac},
		{IP: backend, Ifindex: 1, PodMAC: mac, NodeMAC: mac},
	}); err != nil {
		t.Fatal(err)
	}
	web := services.Port{Frontend: services.Frontend{VIP: vip, Port: 80, Proto: 6}, Name: "web",
		Backends: []services.Backend{{IP: backend, Port: 8080}}}
	if _, err := d.SyncServices([]services.Port{web}); err != nil {
		t.Fatal(err)
	}
	read := flowReader(t, d)
	run := func(pkt []byte) uint32 {
		t.Helper()
		ret, _, err := d.objs.ShuntFromPod.Test(pkt)
		if err != nil {
			t.Fatal(err)
		}
		return ret
	}

	// One free entry: the forward entry goes in, the reply entry does not.
	if err := d.objs.ShuntTcNat.Put(podtcTcNatKey{Saddr: 1, Proto: 6}, podtcTcNatValue{}); err != nil {
		t.Fatal(err)
	}
	before := counts(t, d)
	if ret := run(tcpPacket(client, 40000, vip, 80)); ret != tcActShot {
		t.Errorf("packet whose NAT entry cannot be recorded: verdict %d, want drop", ret)
	}
	counterDelta(t, d, before, map[string]uint64{"nat-insert-failed/from-pod": 1, "invalid-packet/from-pod": 0,
		"service-translated/from-pod": 0})
	expectFlow(t, read(), "DROPPED", "nat-insert-failed")
	if n := countKeysOf(t, d.objs.ShuntTcNat); n != 1 {
		t.Errorf("shunt_tc_nat holds %d entries after the failed insert, want 1 (no half record)", n)
	}
	if err := d.objs.ShuntTcNat.Delete(podtcTcNatKey{Saddr: 1, Proto: 6}); err != nil {
		t.Fatal(err)
	}

	// ClientIP affinity that cannot be recorded: translated all the same.
	fill[sockaddrAffinityKey, sockaddrAffinityValue](t, d.sockAddr.ShuntAffinity, func(i int) sockaddrAffinityKey {
		return sockaddrAffinityKey{ClientCookie: 1, ServiceId: 1<<30 + uint32(i)}
	})
	web.AffinityTimeout = 30
	if _, err := d.SyncServices([]services.Port{web}); err != nil {
		t.Fatal(err)
	}
	before = counts(t, d)
	if ret := run(tcpPacket(client, 40001, vip, 80)); ret != tcActRedirect {
		t.Errorf("packet whose affinity cannot be recorded: verdict %d, want redirect", ret)
	}
	counterDelta(t, d, before, map[string]uint64{"affinity-insert-failed/from-pod": 1, "service-translated/from-pod": 1,
		"forwarded/from-pod": 1})
	expectFlow(t, read(), "FORWARDED", "affinity-insert-failed")

	// Conntrack full: an allowed new connection is dropped.
	if err := d.SyncPolicy(policy.State{Entries: []policy.Entry{
		{Key: policy.Key{Endpoint: backend, Identity: policy.IdentityAny, Proto: 6, Port: 9000, PortBits: 16},
			Verdict: policy.VerdictAllow, RuleID: 7},
	}}, []Endpoint{
		{IP: client, Ifindex: 1, PodMAC: mac, NodeMAC: mac},
		{IP: backend, Ifindex: 1, PodMAC: mac, NodeMAC: mac, IngressIsolated: true, IngressRules: true},
	}); err != nil {
		t.Fatal(err)
	}
	fillCt := func(m *ebpf.Map) {
		for i := 0; countKeysOf(t, m) < int(m.MaxEntries()); i++ {
			if err := m.Put(podtcCtKey{AddrA: uint32(i) + 1, Proto: 17}, podtcCtValue{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	fillCt(d.objs.ShuntCtNew)
	before = counts(t, d)
	if ret := run(tcpPacket(client, 40002, backend, 9000)); ret != tcActShot {
		t.Errorf("allowed connection that conntrack cannot record: verdict %d, want drop", ret)
	}
	counterDelta(t, d, before, map[string]uint64{"ct-full/from-pod": 1, "forwarded/from-pod": 0})
	expectFlow(t, read(), "DROPPED", "ct-full")

	// shunt_ct full: the handshake's last ACK cannot move the connection.
	var k podtcCtKey
	for d.objs.ShuntCtNew.NextKey(nil, &k) == nil {
		if err := d.objs.ShuntCtNew.Delete(k); err != nil {
			t.Fatal(err)
		}
	}
	fillCt(d.objs.ShuntCt)
	run(packet(client, backend, 6, tcpSegment(40003, 9000, tcpSYN)))
	run(packet(backend, client, 6, tcpSegment(9000, 40003, tcpSYNACK)))
	read()
	before = counts(t, d)
	if ret := run(packet(client, backend, 6, tcpSegment(40003, 9000, tcpACK))); ret != tcActRedirect {
		t.Errorf("handshake's last ACK with shunt_ct full: verdict %d, want redirect", ret)
	}
	counterDelta(t, d, before, map[string]uint64{"ct-promote-failed/from-pod": 1, "forwarded/from-pod": 1})
	expectFlow(t, read(), "FORWARDED", "ct-promote-failed")
	if n := countKeysOf(t, d.objs.ShuntCtNew); n != 1 {
		t.Errorf("shunt_ct_new holds %d entries after the failed move, want the connection's 1", n)
	}
}

// listenTCP starts a TCP server in the client.
func listenTCP(c *sockClient, addr string) netip.AddrPort {
	c.t.Helper()
	ans := c.do("listentcp %s", addr)
	ap, err := netip.ParseAddrPort(strings.TrimPrefix(ans, "ok "))
	if err != nil {
		c.t.Fatalf("listentcp %s: %s", addr, ans)
	}
	return ap
}

// syncSockServices programs a TCP service (web, to tcp), a TCP service
// without endpoints (empty, unless invalid) and the UDP DNS service (to
// udp), with ClientIP affinity when affinity > 0.
func syncSockServices(t *testing.T, d *Datapath, affinity uint32, web, tcp, empty, udp netip.AddrPort) {
	t.Helper()
	ports := []services.Port{
		{Frontend: services.Frontend{VIP: web.Addr(), Port: web.Port(), Proto: 6}, Name: "web", AffinityTimeout: affinity,
			Backends: []services.Backend{{IP: tcp.Addr(), Port: tcp.Port()}}},
		{Frontend: services.Frontend{VIP: testDNSVIP.Addr(), Port: testDNSVIP.Port(), Proto: protoUDP}, Name: "dns",
			Backends: []services.Backend{{IP: udp.Addr(), Port: udp.Port()}}},
	}
	if empty.IsValid() {
		ports = append(ports, services.Port{Frontend: services.Frontend{VIP: empty.Addr(), Port: empty.Port(), Proto: 6}, Name: "empty"})
	}
	if _, err := d.SyncServices(ports); err != nil {
		t.Fatal(err)
	}
}

func countKeysOf(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	n, err := countKeys(m)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestOpenReplacesOldCounters: a counters map pinned by an older shunt,
// with another layout, is replaced instead of stopping the agent; a
// compatible one is adopted with its counts. 64*8 entries: the layout
// before SHUNT_METRICS_DIRECTIONS went from 8 to 16 (the overlay's
// direction was the ninth).
func TestOpenReplacesOldCounters(t *testing.T) {
	for _, entries := range []uint32{24, 64 * 8} {
		t.Run(fmt.Sprint(entries), func(t *testing.T) { testOpenReplacesOldCounters(t, entries) })
	}
}

func testOpenReplacesOldCounters(t *testing.T, oldEntries uint32) {
	requireBPF(t)
	pinDir := testPinDir(t)
	if err := os.MkdirAll(pinDir, 0o700); err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: "shunt_metrics", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 16, MaxEntries: oldEntries})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := old.Pin(filepath.Join(pinDir, "shunt_metrics")); err != nil {
		t.Fatal(err)
	}
	d, err := Open(thisKernel(t, Config{PinDir: pinDir, Mode: ModeRedirectPeer}))
	if err != nil {
		t.Fatalf("opening over an old counters map: %v", err)
	}
	if got, want := d.objs.ShuntMetrics.MaxEntries(), uint32(podtcShuntMetricsLayoutSHUNT_METRICS_REASONS*podtcShuntMetricsLayoutSHUNT_METRICS_DIRECTIONS); got != want {
		t.Errorf("shunt_metrics has %d entries, want %d", got, want)
	}
	if _, _, err := d.objs.ShuntFromPod.Test(ipv4Packet(netip.MustParseAddr("10.99.0.1"), netip.MustParseAddr("10.99.0.2"), 64)); err != nil {
		t.Fatal(err)
	}
	d.Close()
	d, err = Open(thisKernel(t, Config{PinDir: pinDir, Mode: ModeRedirectPeer}))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if n := packetsByReason(t, d)["spoofed"]; n != 1 {
		t.Errorf("after a restart the spoofed counter is %d, want 1 (adopted)", n)
	}
}

// TestCountKeysAllocatesNothingPerKey: metrics count every map at each
// scrape, 100 000 keys at 10 000 Services; the walk's allocations must not
// grow with the keys (they were an idle agent's second source of garbage).
func TestCountKeysAllocatesNothingPerKey(t *testing.T) {
	requireBPF(t)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i := range uint64(3000) {
		if err := m.Put(i, uint32(i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := countKeysOf(t, m); n != 3000 {
		t.Fatalf("counted %d keys, want 3000", n)
	}
	if allocs := testing.AllocsPerRun(3, func() { countKeysOf(t, m) }); allocs > 10 {
		t.Errorf("counting 3000 keys made %.0f allocations; want a few, whatever the number of keys", allocs)
	}
}
