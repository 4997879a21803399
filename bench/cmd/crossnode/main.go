// Command crossnode measures pod-to-pod traffic between two nodes on this
// machine (GitHub issue 18), side by side in one run, against one real
// control plane (internal/kubecluster). bench/crossnode.sh runs it and turns
// its rows into the report.
//
// Every case is two node namespaces joined by an underlay bridge in a
// namespace of its own (as test/e2e/crossnode_test.go builds them), a
// client pod on node 1 and ten server pods on node 2, with the same pod
// addresses in every case (shunt's pods are placed first; the baselines
// copy their addresses):
//
//	floor            flannel-style: per node a Linux VXLAN device (VNI 1,
//	                 static FDB and neighbour entries for the other node), a
//	                 bridge holding the pods' veths, a route to the other
//	                 node's pod range through the VXLAN device; no rules
//	calico-iptables  floor + the real kube-proxy (iptables mode) in both
//	                 node namespaces + Calico-shaped iptables policy on the
//	                 server's node (a chain per pod, one rule per allowed
//	                 peer, -policies policies)
//	nftables         floor + the real kube-proxy (nftables mode) in both
//	                 node namespaces
//	shunt-vxlan      shunt's agent per node (`lab up --tunnel vxlan
//	                 --mode redirect-peer`), the same policies as
//	                 NetworkPolicies
//	shunt-native     the same with native routing (`--routing native`: no
//	                 encapsulation, each node routes the other's pod CIDR
//	                 via its underlay address, tc forwards with
//	                 bpf_fib_lookup); two more Nodes of the same cluster, on
//	                 shunt-vxlan's underlay (nodes routed natively share a
//	                 network), with pods of their own (their addresses are
//	                 their Nodes' pod CIDRs) and a measured Service of
//	                 their own, "xbench-native"; with -nodeport annotated
//	                 shunt.io/forwarding-mode: snat, and beside it
//	                 "xbench-native-dsr" annotated dsr, measured as
//	                 shunt-native-dsr (both modes in every run); and
//	                 shunt-vxlan's nodes through "xbench-vxlan-dsr"
//	                 (annotated dsr), measured as shunt-vxlan-dsr
//
// Services are selector-less, each with a hand-written EndpointSlice of the
// ten server pods; the measured one ("xbench") exists at every scale N, the
// N others only weigh on the rules.
//
// Per scale N, repetition and case (cases rotate per repetition): sockperf
// TCP ping-pong (smallest payload) to the server pod's IP and, where the
// case has services, to the ClusterIP (average, p50, p99, transactions/s,
// machine-wide softirq CPU per transaction from /proc/stat); new
// connections/s (bench/cmd/connrate) through the ClusterIP (floor: to the
// ten pod IPs directly); iperf3 single-stream throughput to the server pod.
// Client on CPU 0, servers on CPU 1.
//
// Rows go to -rows as JSON lines in bench/lib.sh's format. Everything the
// run creates (namespaces, processes by PID, the labs, the cluster) is
// removed at the end, also when it fails or is interrupted.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/shuntnet/shunt/bench/internal/benchrun"
	"github.com/shuntnet/shunt/bench/internal/delayline"
	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/kubecluster"
	"github.com/shuntnet/shunt/internal/maglev"
	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/parallel"
	"github.com/shuntnet/shunt/internal/podnet"
)

const (
	serviceCIDR  = "10.96.0.0/16"
	clusterCIDR  = "10.252.0.0/16"
	servers      = 10 // endpoints of every Service
	sockperfPort = 11111
	servePort    = 8080 // bin/shunt lab serve --tcp: connrate's server
	iperfPort    = 5201
	// sockperf's smallest message (its header): the smallest payload.
	msgSize = 14
	// flannel's VXLAN port and the MTU it gives pods on a 1500-byte
	// underlay; shunt gives its pods the same (underlay less 50 bytes).
	flannelPort = 8472
	podMTU      = 1450
)

// Case names, in the report's order; floor is the baseline of the ratios.
const (
	floor    = "floor"
	calico   = "calico-iptables"
	nftables = "nftables"
	shunt    = "shunt-vxlan"
	native   = "shunt-native"
	// nativeDSR (-nodeport) is no case of its own: shunt-native's nodes
	// measured through a second set of Services annotated
	// shunt.io/forwarding-mode: dsr (shunt-native's own are annotated
	// snat), so shunt's two modes are measured in every run, beside each
	// other and kube-proxy.
	nativeDSR = "shunt-native-dsr"
	// vxlanDSR (-nodeport) is shunt-vxlan's nodes through Services
	// annotated dsr: the client's address and the Service's travel in IPIP
	// between the nodes' underlay addresses beside the overlay, which
	// Cilium's DSR does not do (it needs native routing).
	vxlanDSR = "shunt-vxlan-dsr"
)

// dsrCases are the measured cases that are another case's nodes through
// Services annotated dsr.
var dsrCases = []string{nativeDSR, vxlanDSR}

// underlay third octet per case: each case has its own underlay, and the
// kube-proxy and shunt Nodes carry distinct InternalIPs. shunt-native's
// nodes join shunt-vxlan's underlay (hosts .3 and .4): every shunt Node of
// the cluster is then on one network, as native routing needs (each agent
// routes every other Node's pod CIDR via its address).
var underlayNet = map[string]int{floor: 76, shunt: 77, calico: 78, nftables: 79, native: 77}

// underlayHost is the first host number of a case's nodes on its underlay.
var underlayHost = map[string]int{native: 3}

type caseNet struct {
	name   string
	nodes  [2]string // node (host side) network namespaces
	client string    // netns path of the client pod
	// ext (-nodeport): the netns paths of the external hosts on the
	// case's underlay, by measured case (shunt-native's nodes: one for
	// shunt-native, one for shunt-native-dsr; on shunt-vxlan's underlay).
	ext        map[string]string
	hasService bool
	// Only shunt-native's: its own server pods and measured ClusterIP
	// (every other case has shunt-vxlan's addresses: b.serverIP, b.vip).
	serverIP []string
	vip      string
	// serverNetns are the netns paths of the case's server pods (for
	// their TCP counters around each connection-rate run).
	serverNetns []string
	// agents are the shunt agents' instances of nodes 1 and 2 ("": not
	// a shunt case).
	agents [2]string
}

type bench struct {
	measureOnly []string        // -measure: the cases measured (none: all)
	ctx         context.Context // ends on SIGINT/SIGTERM/SIGHUP
	cs          kubernetes.Interface
	kc          *kubecluster.Cluster
	bin         string
	id          string
	out         string
	rows        *os.File
	duration    time.Duration
	settle      time.Duration // the wait after the Services are programmed
	// concurrent: every case measured at once (-smoke: the paths run end
	// to end, the numbers mean nothing).
	concurrent bool
	policies   int
	// nodeport (bench/nodeport.sh): the measured Services are NodePorts,
	// measured from an external host on each case's underlay to node 1
	// (backends on node 2) and node 2 (backends there); no floor, no
	// policies, the kube-proxy cases without Calico's rules.
	nodeport bool
	// linkDelay (-link-delay): every link to an underlay bridge (the
	// nodes' and the external host's) crosses a delay line
	// (bench/internal/delayline) with this one-way latency; 0: none.
	linkDelay time.Duration
	// overlayDecapInDevice (-overlay-decap-in-device): shunt-vxlan's
	// agents decapsulate in the VXLAN device only.
	overlayDecapInDevice bool
	// overlayEncapInDevice (-overlay-encap-in-device): shunt-vxlan's
	// agents encapsulate in the VXLAN device only.
	overlayEncapInDevice bool
	// profile (-profile): every measured new-connections run is also
	// recorded by perf, machine-wide, and its CPU sorted by kind of work
	// (profile.go).
	profile bool
	// bpfStats (-bpf-stats): shunt's agents count their programs' runs
	// and time, logged per new-connections run (progstats.go).
	bpfStats bool

	mu   sync.Mutex
	undo benchrun.Undo // what the run built

	cases    map[string]*caseNet
	clientIP string
	serverIP []string
	podCIDR  [2]string // node 1, node 2 (from shunt's Nodes)
	vip      string    // the measured Service's ClusterIP
	fillers  int       // other Services now in the API
}

func main() {
	var (
		scales        = flag.String("n", "0,1000", "numbers of other Services, comma-separated")
		reps          = flag.Int("reps", 3, "repetitions per scale")
		duration      = flag.Duration("duration", 10*time.Second, "length of each sockperf, iperf3 and connrate run")
		settle        = flag.Duration("settle", 5*time.Second, "how long the dataplanes' syncs and the API burst get to die down after every scale's Services are programmed, before measuring")
		smoke         = flag.Bool("smoke", false, "measure every case at once, not one after another: proves each case's path, and its numbers mean nothing (bench/run NAME --smoke)")
		policies      = flag.Int("policies", 100, "NetworkPolicies on the server pods (Calico-shaped iptables in calico-iptables, NetworkPolicies for shunt)")
		rowsPath      = flag.String("rows", "", "append result rows (JSON lines) here")
		bin           = flag.String("bin", "bin", "directory of shunt, shuntd, shunt-cni, connrate")
		out           = flag.String("out", "bench/out/crossnode", "where the tools' logs go")
		id            = flag.String("id", strconv.Itoa(os.Getpid()%100000), "suffix of every name this run creates")
		measure       = flag.String("measure", "", "measure only these cases, comma-separated (floor, calico-iptables, nftables, shunt-vxlan, shunt-native; with -nodeport kube-proxy-iptables, kube-proxy-nftables, shunt-vxlan, shunt-native, shunt-native-dsr, shunt-vxlan-dsr): every case is still built; e.g. shunt-native,shunt-native-dsr to compare shunt's NodePort modes alone")
		nodeport      = flag.Bool("nodeport", false, "measure NodePorts from an external host on each case's underlay instead of pod-to-pod and ClusterIP traffic (bench/nodeport.sh): no floor, no policies")
		inDevice      = flag.Bool("overlay-decap-in-device", false, "shunt-vxlan's agents leave the overlay's packets to the VXLAN device (--overlay-decap-in-device): the baseline of the uplink's decapsulation in BPF")
		encapInDevice = flag.Bool("overlay-encap-in-device", false, "shunt-vxlan's agents leave the encapsulation to the VXLAN device (--overlay-encap-in-device): the baseline of the encapsulation in BPF")
		profile       = flag.Bool("profile", false, "record each measured new-connections run with perf (whole machine, 1 s in to 1 s before its end) and log its CPU by kind of work: netfilter, bpf, vxlan, the underlay bridge's netfilter, idle, other (perf-*.data and profile-shares.tsv in -out)")
		bpfStats      = flag.Bool("bpf-stats", false, "shunt's agents run with --bpf-stats, and each measured new-connections run of a shunt case logs its programs' runs per connection and time per run, by node and hook (bpf-stats.tsv in -out); the statistics cost time per program run, so such a run's rates are not the benchmark's")
		delay         = flag.Duration("link-delay", 0, "one-way latency of every link to an underlay bridge (nodes and external host), by a delay line in user space (this kernel has no netem): a network where a hop costs time, as DSR's saved hop needs to show; 0: none")
	)
	flag.Parse()
	log.SetFlags(log.Ltime)
	rows, err := os.OpenFile(*rowsPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		log.Fatalf("opening -rows: %v", err)
	}
	runLog, err := os.Create(filepath.Join(*out, "commands-run.txt"))
	if err != nil {
		log.Fatalf("creating the command record: %v", err)
	}
	defer runLog.Close()
	ran.w = runLog
	b := &bench{measureOnly: splitList(*measure), rows: rows, id: *id, out: *out, duration: *duration, settle: *settle, concurrent: *smoke, policies: *policies, nodeport: *nodeport, linkDelay: *delay, profile: *profile, bpfStats: *bpfStats, overlayDecapInDevice: *inDevice, overlayEncapInDevice: *encapInDevice, cases: map[string]*caseNet{}}
	if b.nodeport {
		// NetworkPolicies and Calico's rules judge pod-to-pod traffic;
		// the NodePort benchmark measures the NodePort path alone.
		b.policies = 0
	}
	if b.bin, err = filepath.Abs(*bin); err != nil {
		log.Fatal(err)
	}
	var ns []int
	for _, s := range strings.Split(*scales, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			log.Fatalf("-n %q: not a number of Services", s)
		}
		ns = append(ns, n)
	}
	slices.Sort(ns) // Services are only added between scales
	// Interrupted, it stops what it runs (the context ends the client
	// tools and every wait) and still removes what it built.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	b.ctx = ctx
	err = b.run(ns, *reps)
	if err == nil && b.nodeport {
		err = b.maglevDisruption()
	}
	if ctx.Err() != nil {
		log.Print("interrupted: cleaning up")
	}
	b.undo.Run()
	if err != nil {
		log.Fatal(err)
	}
}

func (b *bench) row(c, metric, unit string, value float64, rep, n int) {
	benchrun.Row(b.rows, b.caseName(c), metric, unit, value, rep, n)
}

// caseName is case c as the report names it: with -nodeport the kube-proxy
// cases have no Calico rules.
func (b *bench) caseName(c string) string {
	switch {
	case b.nodeport && c == calico:
		return "kube-proxy-iptables"
	case b.nodeport && c == nftables:
		return "kube-proxy-nftables"
	}
	return c
}

// ran receives every command the run executes, one shell-quoted line each
// (commands-run.txt): the exact commands behind commands.txt's summary.
var ran struct {
	sync.Mutex
	w io.Writer
}

func record(argv ...string) {
	ran.Lock()
	defer ran.Unlock()
	if ran.w == nil {
		return
	}
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = a
		if a == "" || strings.ContainsAny(a, " \t'\"$*?;&|<>()") {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	fmt.Fprintln(ran.w, strings.Join(q, " "))
}

func sh(name string, args ...string) error {
	record(append([]string{name}, args...)...)
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// switchWithoutNetfilter keeps the underlay bridge of namespace ns from
// handing frames to that namespace's netfilter hooks. The bridge stands
// for the switch between the nodes, which runs no netfilter; but where
// br_netfilter is loaded, every new namespace starts with
// net.bridge.bridge-nf-call-{iptables,ip6tables,arptables} = 1, and every
// case paid 2.4-3.4% of the machine for those hooks (`-profile`'s
// bridge-netfilter). Per namespace since Linux 5.3; without the module
// there is nothing to turn off. The node namespaces keep theirs: a
// flannel node's cni0 bridge does run them (kubeadm asks for it).
func switchWithoutNetfilter(ns string) error {
	const script = `for f in /proc/sys/net/bridge/bridge-nf-call-iptables /proc/sys/net/bridge/bridge-nf-call-ip6tables /proc/sys/net/bridge/bridge-nf-call-arptables; do
	if [ -e "$f" ]; then echo 0 > "$f" || exit 1; fi
done`
	return sh("ip", "netns", "exec", ns, "sh", "-c", script)
}

// ipn runs `ip -n NS ARGS...` for each argument list.
func ipn(ns string, cmds ...[]string) error {
	for _, args := range cmds {
		if err := sh("ip", append([]string{"-n", ns}, args...)...); err != nil {
			return err
		}
	}
	return nil
}

// inNetns is the command line that runs argv in network namespace path:
// nsenter, not `ip netns exec`, which remounts /sys (and would hide bpffs
// and the cgroup tree from shunt).
func inNetns(path string, argv ...string) []string {
	return append([]string{"nsenter", "--net=" + path}, argv...)
}

// start runs a long-lived process (nsenter and taskset exec the program, so
// the PID is the program's); it is killed by that PID at the end.
func (b *bench) start(logName string, argv ...string) error {
	logf, err := os.Create(filepath.Join(b.out, logName+".log"))
	if err != nil {
		return err
	}
	record(append(argv, "&")...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "PATH="+b.bin+":"+os.Getenv("PATH"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", strings.Join(argv, " "), err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	b.undo.Add(func() { cmd.Process.Kill(); <-exited })
	return nil
}

func (b *bench) netns(name string) (string, error) {
	if err := sh("ip", "netns", "add", name); err != nil {
		return "", err
	}
	b.undo.Add(func() { sh("ip", "netns", "del", name) })
	return name, ipn(name, []string{"link", "set", "lo", "up"})
}

func (b *bench) run(scales []int, reps int) error {
	ctx := b.ctx
	dir, err := os.MkdirTemp("", "xbench"+b.id+"-cluster")
	if err != nil {
		return err
	}
	b.undo.Add(func() { os.RemoveAll(dir) })
	b.kc, err = kubecluster.Up(ctx, kubecluster.Options{Dir: dir, ServiceCIDR: serviceCIDR, ClusterCIDR: clusterCIDR, Logf: log.Printf})
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	b.undo.Add(func() { b.kc.Stop() })
	if b.cs, err = b.kc.Clientset(); err != nil {
		return err
	}
	// shunt's CRDs, as an operator installs them first.
	if err := b.kc.Apply(ctx, nil, "deploy/crds/"); err != nil {
		return err
	}
	if err := b.createPolicies(ctx); err != nil {
		return fmt.Errorf("NetworkPolicies: %w", err)
	}
	// shunt first: its IPAM decides the pod addresses, the baselines copy them.
	for _, c := range []string{shunt, native} {
		if err := b.setupShunt(ctx, c); err != nil {
			return fmt.Errorf("case %s: %w", c, err)
		}
	}
	flannelCases := []string{floor, calico, nftables}
	if b.nodeport {
		flannelCases = flannelCases[1:]
	}
	for _, c := range flannelCases {
		if err := b.setupFlannel(c); err != nil {
			return fmt.Errorf("case %s: %w", c, err)
		}
	}
	if !b.nodeport {
		if err := b.calicoPolicy(); err != nil {
			return fmt.Errorf("case %s: policy rules: %w", calico, err)
		}
	}
	for c, mode := range map[string]string{calico: "iptables", nftables: "nftables"} {
		for i := range 2 {
			if err := b.startKubeProxy(ctx, c, mode, i); err != nil {
				return fmt.Errorf("case %s: kube-proxy on node %d: %w", c, i+1, err)
			}
		}
	}
	if b.vip, err = b.createService(ctx, "xbench", measuredPorts[shunt], b.serverIP); err != nil {
		return fmt.Errorf("the measured Service: %w", err)
	}
	nc := b.cases[native]
	if nc.vip, err = b.createService(ctx, "xbench-native", measuredPorts[native], nc.serverIP); err != nil {
		return fmt.Errorf("the measured Service of %s: %w", native, err)
	}
	if b.nodeport {
		// iperf3's server runs on the first server pod only.
		if _, err := b.createService(ctx, "xbench-iperf", &nodePorts{iperf: measuredPorts[shunt].iperf}, b.serverIP[:1]); err != nil {
			return err
		}
		np := measuredPorts[native]
		if _, err := b.createService(ctx, "xbench-native-iperf", &nodePorts{iperf: np.iperf, forwarding: np.forwarding}, nc.serverIP[:1]); err != nil {
			return err
		}
		// The DSR Services of shunt-native and shunt-vxlan: the same
		// server pods as their SNAT ones.
		for _, c := range dsrCases {
			name, servers := "xbench-native-dsr", nc.serverIP
			if nodesOf(c) == shunt {
				name, servers = "xbench-vxlan-dsr", b.serverIP
			}
			dsr := measuredPorts[c]
			if _, err := b.createService(ctx, name, dsr, servers); err != nil {
				return fmt.Errorf("the measured Service of %s: %w", c, err)
			}
			if _, err := b.createService(ctx, name+"-iperf", &nodePorts{iperf: dsr.iperf, forwarding: dsr.forwarding}, servers[:1]); err != nil {
				return err
			}
		}
	}
	// Thousands of short connections a second from one client: let it
	// reuse TIME_WAIT ports, or every case after the first runs out.
	for _, c := range b.cases {
		for _, path := range append([]string{c.client}, slices.Collect(maps.Values(c.ext))...) {
			if path == "" {
				continue
			}
			if err := sh("nsenter", "--net="+path, "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1", "net.ipv4.ip_local_port_range=1024 65000"); err != nil {
				return err
			}
		}
	}
	if err := b.waitServers(ctx); err != nil {
		return err
	}
	// The client got in through the Calico-shaped rules by its own rule
	// (the last policy's), not around them.
	order := []string{floor, calico, nftables, shunt, native}
	if b.nodeport {
		order = append(order[1:], dsrCases...)
	} else if err := b.checkCalicoPath(); err != nil {
		return err
	}
	if len(b.measureOnly) > 0 {
		// A case is named as the report names it, or as the code does
		// (with -nodeport, kube-proxy-nftables is nftables).
		var only, names []string
		for _, o := range order {
			names = append(names, b.caseName(o))
		}
		for _, c := range b.measureOnly {
			i := slices.Index(names, c)
			if i < 0 {
				i = slices.Index(order, c)
			}
			if i < 0 {
				return fmt.Errorf("-measure %s: no such case here (cases: %s)", c, strings.Join(names, ", "))
			}
			only = append(only, order[i])
		}
		order = only
	}
	for _, n := range scales {
		if err := b.scaleTo(ctx, n); err != nil {
			return fmt.Errorf("N=%d: %w", n, err)
		}
		for rep := 1; rep <= reps; rep++ {
			if b.concurrent {
				// Measured names sharing one case's nodes (a case and
				// its DSR Services) go one after the other: its iperf3
				// server takes one test at a time.
				lanes := map[string][]string{}
				for _, c := range order {
					lanes[nodesOf(c)] = append(lanes[nodesOf(c)], c)
				}
				errs := make([]error, len(order))
				var wg sync.WaitGroup
				for i, c := range order {
					if lanes[nodesOf(c)][0] != c {
						continue
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						for _, c := range lanes[nodesOf(c)] {
							if err := b.measure(c, n, rep); err != nil {
								errs[i] = fmt.Errorf("N=%d rep %d case %s: %w", n, rep, c, err)
								return
							}
						}
					}()
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					return err
				}
				continue
			}
			for i := range order {
				if err := ctx.Err(); err != nil {
					return err
				}
				c := order[(i+rep-1)%len(order)]
				if err := b.measure(c, n, rep); err != nil {
					return fmt.Errorf("N=%d rep %d case %s: %w", n, rep, c, err)
				}
			}
		}
	}
	return nil
}

// underlay makes the case's two node namespaces joined to a bridge in a
// third, node i at 192.168.<net>.(host+i)/24 on its ul0; shunt-native's
// join shunt-vxlan's bridge (made first).
func (b *bench) underlay(c string) (*caseNet, error) {
	cn := &caseNet{name: c}
	ul := fmt.Sprintf("xb%s-%s-ul", b.id, shunt)
	if c != native {
		var err error
		if ul, err = b.netns(fmt.Sprintf("xb%s-%s-ul", b.id, c)); err != nil {
			return nil, err
		}
		if err := ipn(ul, []string{"link", "add", "br0", "type", "bridge"}, []string{"link", "set", "br0", "up"}); err != nil {
			return nil, err
		}
		if err := switchWithoutNetfilter(ul); err != nil {
			return nil, err
		}
	}
	for i := range 2 {
		ns, err := b.netns(fmt.Sprintf("xb%s-%s-n%d", b.id, c, i+1))
		if err != nil {
			return nil, err
		}
		port := fmt.Sprintf("n%d", max(underlayHost[c], 1)+i)
		if err := ipn(ns,
			[]string{"link", "add", "ul0", "type", "veth", "peer", "name", port, "netns", ul},
			[]string{"addr", "add", b.underlayAddr(c, i) + "/24", "dev", "ul0"},
			[]string{"link", "set", "ul0", "up"},
		); err != nil {
			return nil, err
		}
		if err := b.joinBridge(ul, port); err != nil {
			return nil, err
		}
		if b.linkDelay > 0 {
			// A delay line's packet socket takes a GSO frame only with
			// a virtio-net header, which has no tunnel types: the
			// node's uplink segments VXLAN and IPIP (DSR) frames in
			// software, as a NIC without tunnel offload makes the
			// stack do, or the line would drop them.
			if err := sh("ip", "netns", "exec", ns, "ethtool", "-K", "ul0", "tx-udp_tnl-segmentation", "off",
				"tx-udp_tnl-csum-segmentation", "off", "tx-ipxip4-segmentation", "off"); err != nil {
				return nil, err
			}
		}
		// Agents and kube-proxy reach the API server on the machine's
		// loopback through a relay on the node's own loopback.
		if err := b.relay(ns); err != nil {
			return nil, err
		}
		cn.nodes[i] = ns
	}
	if b.nodeport {
		// Every measured case has an external host of its own, as a
		// client of its own: one holding the closed connections of
		// another case (its TIME_WAIT sockets and their ports, for a
		// minute) would start each run unlike the others. shunt-native's
		// two (SNAT and DSR) are on shunt-vxlan's underlay beside its
		// two (SNAT and shunt-vxlan-dsr).
		cn.ext = map[string]string{}
		for _, name := range append([]string{c}, dsrCases...) {
			if nodesOf(name) != c {
				continue
			}
			host := externalHost + externalOffset[name]
			ext, err := b.netns(fmt.Sprintf("xb%s-%s-ext", b.id, name))
			if err != nil {
				return nil, err
			}
			port := fmt.Sprintf("e%d", host)
			if err := ipn(ext,
				[]string{"link", "add", "ul0", "type", "veth", "peer", "name", port, "netns", ul},
				[]string{"addr", "add", fmt.Sprintf("192.168.%d.%d/24", underlayNet[c], host), "dev", "ul0"},
				[]string{"link", "set", "ul0", "up"},
			); err != nil {
				return nil, err
			}
			if err := b.joinBridge(ul, port); err != nil {
				return nil, err
			}
			cn.ext[name] = "/run/netns/" + ext
		}
	}
	b.cases[c] = cn
	return cn, nil
}

// joinBridge makes port (a link of underlay namespace ul) a port of its
// bridge br0, or with -link-delay joins it through a delay line: port
// and PORTd are the line's two ends, PORTd's peer PORTb the bridge's
// port.
func (b *bench) joinBridge(ul, port string) error {
	if b.linkDelay <= 0 {
		return ipn(ul, []string{"link", "set", port, "master", "br0", "up"})
	}
	if err := ipn(ul,
		[]string{"link", "add", port + "d", "type", "veth", "peer", "name", port + "b"},
		[]string{"link", "set", port + "b", "master", "br0", "up"},
		[]string{"link", "set", port + "d", "up"},
		[]string{"link", "set", port, "up"},
	); err != nil {
		return err
	}
	record("#delayline", "-netns", ul, port, port+"d", "-delay", b.linkDelay.String())
	l, err := delayline.Start("/run/netns/"+ul, port, port+"d", b.linkDelay)
	if err != nil {
		return err
	}
	b.undo.Add(func() {
		passed, dropped := l.Stats()
		log.Printf("delay line %s %s: frames passed %v, dropped %v", ul, port, passed, dropped)
		l.Close()
	})
	return nil
}

func (b *bench) underlayAddr(c string, i int) string {
	return fmt.Sprintf("192.168.%d.%d", underlayNet[c], max(underlayHost[c], 1)+i)
}

// relay makes the API server reachable inside namespace ns.
func (b *bench) relay(ns string) error {
	r, err := b.kc.RelayInto("/run/netns/" + ns)
	if err != nil {
		return err
	}
	b.undo.Add(func() { r.Close() })
	return nil
}

// node creates a Node with its InternalIP, as a kubelet reports it (the
// controller-manager writes the pod CIDR meanwhile: conflicts are retried).
func (b *bench) node(ctx context.Context, name, addr string) error {
	nodes := b.cs.CoreV1().Nodes()
	if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating Node %s: %w", name, err)
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}
		_, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// setupShunt starts an agent per node of case c (shunt-vxlan: the VXLAN
// overlay; shunt-native: native routing) and runs the pods through the
// API: the client on node 1, the servers on node 2.
func (b *bench) setupShunt(ctx context.Context, c string) error {
	cn, err := b.underlay(c)
	if err != nil {
		return err
	}
	cn.hasService = true
	routing, letter, prefix := []string{"--tunnel", "vxlan"}, "s", ""
	if c == native {
		routing, letter, prefix = []string{"--routing", "native"}, "r", "native-"
	} else {
		if b.overlayDecapInDevice {
			routing = append(routing, "--overlay-decap-in-device")
		}
		if b.overlayEncapInDevice {
			routing = append(routing, "--overlay-encap-in-device")
		}
	}
	if b.bpfStats {
		routing = append(routing, "--bpf-stats")
	}
	if b.nodeport {
		// Pods route only the cluster's addresses unless the node
		// masquerades: a backend on the ingress node could not answer an
		// outside client whose address it sees.
		routing = append(routing, "--masquerade")
	}
	shuntBin := filepath.Join(b.bin, "shunt")
	var insts [2]string
	for i := range 2 {
		insts[i] = fmt.Sprintf("xb%s%s%d", b.id, letter, i+1)
		inst := insts[i]
		cn.agents[i] = inst
		if err := b.node(ctx, inst, b.underlayAddr(c, i)); err != nil {
			return err
		}
		ns := "/run/netns/" + cn.nodes[i]
		down := inNetns(ns, shuntBin, "--instance", inst, "lab", "down")
		b.undo.Add(func() {
			// The agent's log outlives its lab, for the report.
			if raw, err := os.ReadFile(filepath.Join(instance.Instance{Name: inst}.StateDir(), "shuntd.log")); err == nil {
				os.WriteFile(filepath.Join(b.out, inst+"-shuntd.log"), raw, 0o644)
			}
			if err := sh(down[0], down[1:]...); err != nil {
				log.Printf("removing lab %s: %v", inst, err)
			}
		})
		argv := inNetns(ns, append([]string{shuntBin, "--instance", inst, "lab", "up", "--kubeconfig", b.kc.Kubeconfig, "--node-name", inst,
			"--service-cidr", serviceCIDR, "--mode", "redirect-peer", "--cluster-cidr", clusterCIDR}, routing...)...)
		// One more try: shuntd can die at start-up (a nil a.objects called
		// by the problem-events goroutine before agent.New assigns it, seen
		// on this busy machine); the retry is logged, not hidden.
		for try := 1; ; try++ {
			err := sh(argv[0], argv[1:]...)
			if err == nil {
				break
			}
			if try == 2 {
				return fmt.Errorf("agent of node %d (log: %s): %w", i+1, filepath.Join(b.out, inst+"-shuntd.log"), err)
			}
			if raw, rerr := os.ReadFile(filepath.Join(instance.Instance{Name: inst}.StateDir(), "shuntd.log")); rerr == nil {
				os.WriteFile(filepath.Join(b.out, inst+"-shuntd-failed-start.log"), raw, 0o644)
			}
			log.Printf("WARNING: shunt agent of node %d failed to start, retrying once (log kept in %s): %v", i+1,
				filepath.Join(b.out, inst+"-shuntd-failed-start.log"), err)
			sh(down[0], down[1:]...)
		}
		n, err := b.cs.CoreV1().Nodes().Get(ctx, inst, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Spec.PodCIDR == "" {
			return fmt.Errorf("Node %s has no pod CIDR after its agent started", inst)
		}
		if c == shunt {
			b.podCIDR[i] = n.Spec.PodCIDR
		}
	}
	var serverIP []string
	pin := func(argv ...string) []string { return append([]string{"taskset", "-c", "1"}, argv...) }
	for i := range servers {
		ctrs := []corev1.Container{
			{Name: "sockperf", Image: "lab", Command: pin("sockperf", "server", "--tcp", "-i", "0.0.0.0", "-p", strconv.Itoa(sockperfPort))},
			{Name: "serve", Image: "lab", Command: pin("shunt", "lab", "serve", "--tcp", strconv.Itoa(servePort))},
		}
		if i == 0 {
			ctrs = append(ctrs, corev1.Container{Name: "iperf3", Image: "lab", Command: pin("iperf3", "-s", "-p", strconv.Itoa(iperfPort))})
		}
		ip, err := b.runPod(ctx, fmt.Sprintf("%sserver-%d", prefix, i), insts[1], map[string]string{"app": "server"}, ctrs)
		if err != nil {
			return err
		}
		serverIP = append(serverIP, ip)
		cn.serverNetns = append(cn.serverNetns, podnet.NetnsPath(instance.Instance{Name: insts[1]}.PodNetns("default", fmt.Sprintf("%sserver-%d", prefix, i))))
	}
	clientIP, err := b.runPod(ctx, prefix+"client", insts[0], map[string]string{"app": "client"},
		[]corev1.Container{{Name: "c", Image: "lab", Command: []string{"sleep", "infinity"}}})
	if err != nil {
		return err
	}
	cn.client = podnet.NetnsPath(instance.Instance{Name: insts[0]}.PodNetns("default", prefix+"client"))
	if c == shunt {
		b.serverIP, b.clientIP = serverIP, clientIP
	} else {
		cn.serverIP = serverIP
	}
	log.Printf("%s: client %s, servers %s", c, clientIP, strings.Join(serverIP, " "))
	return nil
}

// servers are the server pods' addresses of case cn.
func (b *bench) servers(cn *caseNet) []string {
	if cn.serverIP != nil {
		return cn.serverIP
	}
	return b.serverIP
}

// measuredVIP is the ClusterIP case cn measures.
func (b *bench) measuredVIP(cn *caseNet) string {
	if cn.vip != "" {
		return cn.vip
	}
	return b.vip
}

func (b *bench) runPod(ctx context.Context, name, node string, labels map[string]string, ctrs []corev1.Container) (string, error) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: ctrs}}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := b.cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "serviceaccount") {
			return false, nil // the default ServiceAccount comes a moment later
		}
		return err == nil, err
	}); err != nil {
		return "", fmt.Errorf("creating pod %s: %w", name, err)
	}
	var ip string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := b.cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ip = got.Status.PodIP
		return got.Status.Phase == corev1.PodRunning && ip != "", nil
	})
	if err != nil {
		return "", fmt.Errorf("pod %s on %s never ran: %w", name, node, err)
	}
	return ip, nil
}

// setupFlannel builds case c the way flannel's vxlan backend plumbs a
// node: a VXLAN device flannel.1 (VNI 1, port 8472, no learning) holding
// the node's .0 address, the other node's VTEP known by static neighbour
// and FDB entries, a route to its pod range via its .0 through flannel.1;
// pods on veths in a bridge cni0 holding the gateway (.1). The pod
// addresses are shunt's.
func (b *bench) setupFlannel(c string) error {
	cn, err := b.underlay(c)
	if err != nil {
		return err
	}
	cn.hasService = c != floor
	base := func(cidr string) string { return strings.TrimSuffix(strings.SplitN(cidr, "/", 2)[0], ".0") }
	mac := func(i int) string { return fmt.Sprintf("0e:5b:00:00:%02x:%02x", underlayNet[c], i+1) }
	for i := range 2 {
		ns, j := cn.nodes[i], 1-i
		if err := sh("nsenter", "--net=/run/netns/"+ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"); err != nil {
			return err
		}
		if err := ipn(ns,
			[]string{"link", "add", "flannel.1", "type", "vxlan", "id", "1", "local", b.underlayAddr(c, i), "dev", "ul0",
				"dstport", strconv.Itoa(flannelPort), "nolearning"},
			[]string{"link", "set", "flannel.1", "address", mac(i), "mtu", strconv.Itoa(podMTU)},
			[]string{"addr", "add", base(b.podCIDR[i]) + ".0/32", "dev", "flannel.1"},
			[]string{"link", "set", "flannel.1", "up"},
			[]string{"neigh", "add", base(b.podCIDR[j]) + ".0", "lladdr", mac(j), "dev", "flannel.1", "nud", "permanent"},
			[]string{"route", "add", b.podCIDR[j], "via", base(b.podCIDR[j]) + ".0", "dev", "flannel.1", "onlink"},
			[]string{"link", "add", "cni0", "type", "bridge"},
			[]string{"addr", "add", base(b.podCIDR[i]) + ".1/24", "dev", "cni0"},
			[]string{"link", "set", "cni0", "up"},
		); err != nil {
			return err
		}
		if err := sh("bridge", "-n", ns, "fdb", "append", mac(j), "dev", "flannel.1", "dst", b.underlayAddr(c, j), "self", "permanent"); err != nil {
			return err
		}
	}
	pod := func(node int, name, ip string) (string, error) {
		ns, err := b.netns(fmt.Sprintf("xb%s-%s-%s", b.id, c, name))
		if err != nil {
			return "", err
		}
		host := "veth" + name
		if len(host) > 15 {
			host = host[:15]
		}
		if err := ipn(cn.nodes[node],
			[]string{"link", "add", host, "mtu", strconv.Itoa(podMTU), "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"link", "set", host, "master", "cni0", "up"},
		); err != nil {
			return "", err
		}
		return "/run/netns/" + ns, ipn(ns,
			[]string{"link", "set", "eth0", "up"},
			[]string{"addr", "add", ip + "/24", "dev", "eth0"},
			[]string{"route", "add", "default", "via", base(b.podCIDR[node]) + ".1"},
		)
	}
	if cn.client, err = pod(0, "client", b.clientIP); err != nil {
		return err
	}
	for i, ip := range b.serverIP {
		path, err := pod(1, "srv"+strconv.Itoa(i), ip)
		if err != nil {
			return err
		}
		cn.serverNetns = append(cn.serverNetns, path)
		pin := func(argv ...string) []string {
			return inNetns(path, append([]string{"taskset", "-c", "1"}, argv...)...)
		}
		if err := b.start(fmt.Sprintf("%s-srv%d-sockperf", c, i), pin("sockperf", "server", "--tcp", "-i", "0.0.0.0", "-p", strconv.Itoa(sockperfPort))...); err != nil {
			return err
		}
		if err := b.start(fmt.Sprintf("%s-srv%d-serve", c, i), pin(filepath.Join(b.bin, "shunt"), "lab", "serve", "--tcp", strconv.Itoa(servePort))...); err != nil {
			return err
		}
		if i == 0 {
			if err := b.start(c+"-srv0-iperf3", pin("iperf3", "-s", "-p", strconv.Itoa(iperfPort))...); err != nil {
				return err
			}
		}
	}
	return nil
}

// startKubeProxy runs the real kube-proxy in node i of case c, its own
// Node, its rules only in that namespace.
func (b *bench) startKubeProxy(ctx context.Context, c, mode string, i int) error {
	name := fmt.Sprintf("xb%s-%s%d", b.id, mode[:3], i+1)
	if err := b.node(ctx, name, b.underlayAddr(c, i)); err != nil {
		return err
	}
	kc := filepath.Join(b.kc.Dir, name+".kubeconfig")
	if err := kubecluster.IssueKubeconfig(b.kc.Dir, kc, "system:kube-proxy"); err != nil {
		return err
	}
	// The conntrack flags at 0: kube-proxy leaves the machine-wide
	// conntrack sysctls alone.
	return b.start(fmt.Sprintf("%s-kube-proxy-n%d", c, i+1), inNetns("/run/netns/"+b.cases[c].nodes[i], filepath.Join(b.kc.BinDir, "kube-proxy"),
		"--kubeconfig", kc, "--hostname-override", name, "--proxy-mode", mode, "--cluster-cidr", clusterCIDR,
		"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "127.0.0.1:10256",
		"--conntrack-max-per-core", "0", "--conntrack-tcp-timeout-established", "0", "--conntrack-tcp-timeout-close-wait", "0")...)
}

// peerIP is the address policy k allows: the client for the last policy,
// addresses no pod has for the others.
func (b *bench) peerIP(k int) string {
	if k == b.policies-1 {
		return b.clientIP
	}
	return fmt.Sprintf("172.16.%d.%d", k/250, k%250+1)
}

// createPolicies: -policies NetworkPolicies selecting the server pods, each
// allowing ingress from one peer; the client is allowed by the last.
func (b *bench) createPolicies(ctx context.Context) error {
	for k := range b.policies {
		var from networkingv1.NetworkPolicyPeer
		if k == b.policies-1 {
			from.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}
		} else {
			from.IPBlock = &networkingv1.IPBlock{CIDR: b.peerIP(k) + "/32"}
		}
		np := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("allow-%d", k), Namespace: "default"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{from}}},
			},
		}
		if _, err := b.cs.NetworkingV1().NetworkPolicies("default").Create(ctx, np, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// calicoPolicy loads the same policies into the server node of
// calico-iptables the way Calico's Felix lays them out in the filter
// table: FORWARD -> cali-FORWARD -> cali-to-wl-dispatch -> a chain per
// workload (cali-tw-*: established accepted first, then every policy chain
// in turn, returning once one marked the packet, else DROP) -> a chain per
// policy (cali-pi-*: one rule per allowed peer). Felix matches peers with
// ipsets and dispatches by interface (cali+); here each policy has one
// /32 peer, and the dispatch matches the pod's address because a bridge
// hides the pod's veth from the IP layer (no br_netfilter).
func (b *bench) calicoPolicy() error {
	var r strings.Builder
	r.WriteString("*filter\n:cali-FORWARD - [0:0]\n:cali-to-wl-dispatch - [0:0]\n")
	for i := range b.serverIP {
		fmt.Fprintf(&r, ":cali-tw-srv%d - [0:0]\n", i)
	}
	for k := range b.policies {
		fmt.Fprintf(&r, ":cali-pi-allow-%d - [0:0]\n", k)
	}
	r.WriteString("-I FORWARD 1 -j cali-FORWARD\n")
	r.WriteString("-A cali-FORWARD -j MARK --set-xmark 0x0/0xe0000\n")
	r.WriteString("-A cali-FORWARD -o cni0 -j cali-to-wl-dispatch\n")
	r.WriteString("-A cali-FORWARD -m mark --mark 0x10000/0x10000 -j ACCEPT\n")
	for i, ip := range b.serverIP {
		fmt.Fprintf(&r, "-A cali-to-wl-dispatch -d %s/32 -g cali-tw-srv%d\n", ip, i)
	}
	r.WriteString("-A cali-to-wl-dispatch -j DROP\n")
	for i := range b.serverIP {
		ch := fmt.Sprintf("cali-tw-srv%d", i)
		fmt.Fprintf(&r, "-A %s -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n", ch)
		fmt.Fprintf(&r, "-A %s -m conntrack --ctstate INVALID -j DROP\n", ch)
		fmt.Fprintf(&r, "-A %s -j MARK --set-xmark 0x0/0x10000\n", ch)
		for k := range b.policies {
			fmt.Fprintf(&r, "-A %s -m mark --mark 0x0/0x10000 -j cali-pi-allow-%d\n", ch, k)
			fmt.Fprintf(&r, "-A %s -m mark --mark 0x10000/0x10000 -j RETURN\n", ch)
		}
		fmt.Fprintf(&r, "-A %s -j DROP\n", ch)
	}
	for k := range b.policies {
		fmt.Fprintf(&r, "-A cali-pi-allow-%d -s %s/32 -j MARK --set-xmark 0x10000/0x10000\n", k, b.peerIP(k))
		fmt.Fprintf(&r, "-A cali-pi-allow-%d -m mark --mark 0x10000/0x10000 -j RETURN\n", k)
	}
	r.WriteString("COMMIT\n")
	path := filepath.Join(b.out, "calico-policy.rules")
	if err := os.WriteFile(path, []byte(r.String()), 0o644); err != nil {
		return err
	}
	argv := []string{"nsenter", "--net=/run/netns/" + b.cases[calico].nodes[1], "iptables-restore", "--noflush", path}
	record(argv...)
	cmd := exec.Command(argv[0], argv[1:]...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-restore %s: %v: %s", path, err, out)
	}
	return nil
}

// checkCalicoPath reads the packet counter of the rule that allows the
// client: waitServers' connections must have matched it.
func (b *bench) checkCalicoPath() error {
	ch := fmt.Sprintf("cali-pi-allow-%d", b.policies-1)
	out, err := exec.Command("nsenter", "--net=/run/netns/"+b.cases[calico].nodes[1], "iptables", "-t", "filter", "-L", ch, "-v", "-x", "-n").CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables -L %s: %v: %s", ch, err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[2] == "MARK" && strings.Contains(l, b.clientIP) {
			if f[0] == "0" {
				return fmt.Errorf("case %s: the client's new connections did not go through the policy rules (%s counted 0 packets)", calico, ch)
			}
			log.Printf("%s: the client's policy rule (%s) matched %s packets", calico, ch, f[0])
			return nil
		}
	}
	return fmt.Errorf("case %s: no rule for the client %s in %s:\n%s", calico, b.clientIP, ch, out)
}

// nodePorts are a measured Service's ports: lab serve's (80) and
// sockperf's, and with -nodeport their nodePorts and iperf3's (a Service
// of its own: one endpoint), and its annotation shunt.io/forwarding-mode
// ("": none). nil: a filler Service (port 80 only).
type nodePorts struct {
	serve, sockperf, iperf int32
	forwarding             string
}

// measuredPorts are the nodePorts of the measured Services: xbench (every
// case but shunt-native and the DSR ones), xbench-native (SNAT),
// xbench-native-dsr and xbench-vxlan-dsr.
var measuredPorts = map[string]*nodePorts{shunt: {30080, 31111, 30201, ""}, native: {30081, 31112, 30202, "snat"},
	nativeDSR: {30082, 31113, 30203, "dsr"}, vxlanDSR: {30083, 31114, 30204, "dsr"}}

// nodesOf is the case whose nodes measured name c measures.
func nodesOf(c string) string {
	switch c {
	case nativeDSR:
		return native
	case vxlanDSR:
		return shunt
	}
	return c
}

// externalHost is the host number of a case's external host (-nodeport)
// on its underlay, plus externalOffset for the cases on shunt-vxlan's.
const externalHost = 200

var externalOffset = map[string]int{native: 1, nativeDSR: 2, vxlanDSR: 3}

// createService makes a selector-less Service and its slice of the server
// pods at endpoints; a measured one (np not nil) also has sockperf's port,
// and with -nodeport it is a NodePort (np's ports; np.iperf alone: iperf3's
// Service). It returns the ClusterIP.
func (b *bench) createService(ctx context.Context, name string, np *nodePorts, endpoints []string) (string, error) {
	ports := []corev1.ServicePort{{Name: "tcp", Port: 80, TargetPort: intstr.FromInt32(servePort)}}
	spec := corev1.ServiceSpec{}
	switch {
	case np != nil && np.iperf != 0 && np.serve == 0:
		ports = []corev1.ServicePort{{Name: "iperf", Port: iperfPort, TargetPort: intstr.FromInt32(iperfPort), NodePort: np.iperf}}
	case np != nil:
		ports = append(ports, corev1.ServicePort{Name: "sockperf", Port: sockperfPort, TargetPort: intstr.FromInt32(sockperfPort)})
		if b.nodeport {
			ports[0].NodePort, ports[1].NodePort = np.serve, np.sockperf
		}
	}
	meta := metav1.ObjectMeta{Name: name}
	if b.nodeport && np != nil {
		spec.Type = corev1.ServiceTypeNodePort
		if np.forwarding != "" {
			meta.Annotations = map[string]string{dpinfo.ForwardingModeAnnotation: np.forwarding}
		}
	}
	spec.Ports = ports
	svc, err := createRetrying(ctx, func() (*corev1.Service, error) {
		return b.cs.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: meta, Spec: spec}, metav1.CreateOptions{})
	}, func() (*corev1.Service, error) {
		return b.cs.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
	})
	if err != nil {
		return "", err
	}
	proto, ready := corev1.ProtocolTCP, true
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range ports {
		pname, port := p.Name, p.TargetPort.IntVal
		sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: &pname, Port: &port, Protocol: &proto})
	}
	for _, ip := range endpoints {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	if _, err := createRetrying(ctx, func() (*discoveryv1.EndpointSlice, error) {
		return b.cs.DiscoveryV1().EndpointSlices("default").Create(ctx, sl, metav1.CreateOptions{})
	}, func() (*discoveryv1.EndpointSlice, error) {
		return b.cs.DiscoveryV1().EndpointSlices("default").Get(ctx, name, metav1.GetOptions{})
	}); err != nil {
		return "", err
	}
	return svc.Spec.ClusterIP, nil
}

// createRetrying creates an object, again after the API server timed out
// (a busy machine: 10 000 Services against a control plane sharing two
// cores), and takes the object as it is when an earlier try created it
// after all.
func createRetrying[T any](ctx context.Context, create, get func() (T, error)) (T, error) {
	for try := 1; ; try++ {
		out, err := create()
		switch {
		case err == nil:
			return out, nil
		case apierrors.IsAlreadyExists(err) && try > 1:
			return get()
		case (apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err)) && try < 5:
			select {
			case <-ctx.Done():
				return out, ctx.Err()
			case <-time.After(time.Duration(try) * time.Second):
			}
		default:
			return out, err
		}
	}
}

// waitServers waits until every server of every case answers on its pod
// address from the client (all ports; the policy lets the client in).
func (b *bench) waitServers(ctx context.Context) error {
	for _, c := range b.cases {
		for _, ip := range b.servers(c) {
			// Not iperf3's port: a bare connection makes its server fail
			// the next test; its client retries instead.
			for _, p := range []int{sockperfPort, servePort} {
				wctx, cancel := context.WithTimeout(ctx, time.Minute)
				err := dialUntil(wctx, c.client, net.JoinHostPort(ip, strconv.Itoa(p)))
				cancel()
				if err != nil {
					return fmt.Errorf("case %s: server %s:%d never answered the client: %w", c.name, ip, p, err)
				}
			}
		}
	}
	return nil
}

// dialUntil connects to addr from namespace path until it succeeds.
func dialUntil(ctx context.Context, path, addr string) error {
	return netnsrun.Do(path, func() error {
		for {
			c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				c.Close()
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
}

// answers says whether vip:80 answers a request (lab serve replies).
func answers(path, vip string) bool { return answersAt(path, net.JoinHostPort(vip, "80")) }

// answersAt says whether addr answers a request (lab serve replies).
func answersAt(path, addr string) bool {
	ok := false
	netnsrun.Do(path, func() error {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			return nil
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := c.Write([]byte("ping")); err != nil {
			return nil
		}
		_, err = c.Read(make([]byte, 64))
		ok = err == nil
		return nil
	})
	return ok
}

// createWorkers is how many Services scaleTo creates at once.
const createWorkers = 32

// scaleTo adds Services until n others exist, then waits until the last
// one and the measured one answer through every case that has services.
func (b *bench) scaleTo(ctx context.Context, n int) error {
	t0 := time.Now()
	// In parallel: one create at a time measured the API server's
	// latency per request (~7 Services/s on a loaded machine, 23 minutes
	// for 10 000), not what the agents do with them.
	// last is the Service whose objects were created last: once it
	// answers, an agent has taken every create before it (informers
	// deliver in the API server's order).
	var (
		last string
		mu   sync.Mutex
	)
	if count := n - b.fillers; count > 0 {
		errs := make([]error, count)
		parallel.Limit(count, createWorkers, func(i int) {
			vip, err := b.createService(ctx, fmt.Sprintf("s%d", b.fillers+i), nil, b.serverIP)
			mu.Lock()
			errs[i], last = err, vip
			mu.Unlock()
		})
		for i, err := range errs {
			if err != nil {
				return fmt.Errorf("creating Service s%d: %w", b.fillers+i, err)
			}
		}
	}
	b.fillers = max(b.fillers, n)
	log.Printf("N=%d: Services created in %s", n, time.Since(t0).Round(time.Millisecond))
	for _, c := range b.cases {
		if !c.hasService {
			continue
		}
		vips := []string{b.measuredVIP(c)}
		// The other Services' endpoints are shunt-vxlan's servers, which
		// shunt-native's client does not reach (its replies would go
		// back encapsulated): that case waits for its own Service only.
		if last != "" && c.name != native {
			vips = append(vips, last)
		}
		for _, vip := range vips {
			deadline := time.Now().Add(5 * time.Minute)
			for !answers(c.client, vip) {
				if err := ctx.Err(); err != nil {
					return err
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("case %s: ClusterIP %s does not answer after 5 minutes", c.name, vip)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		if b.nodeport {
			// The NodePorts from the external host, through both nodes
			// (shunt-native: its SNAT and its DSR Services').
			type probe struct{ ext, addr string }
			var probes []probe
			for _, name := range append([]string{c.name}, dsrCases...) {
				if nodesOf(name) == c.name {
					probes = append(probes, probe{c.ext[name], b.nodePortAddr(c, 0, b.ports(name).serve)},
						probe{c.ext[name], b.nodePortAddr(c, 1, b.ports(name).serve)})
				}
			}
			for _, p := range probes {
				deadline := time.Now().Add(5 * time.Minute)
				for !answersAt(p.ext, p.addr) {
					if err := ctx.Err(); err != nil {
						return err
					}
					if time.Now().After(deadline) {
						return fmt.Errorf("case %s: NodePort %s does not answer the external host after 5 minutes", c.name, p.addr)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		}
		log.Printf("N=%d: %s programmed %s after the first create", n, c.name, time.Since(t0).Round(time.Millisecond))
	}
	// Let the dataplanes' syncs (kube-proxy's run at most once a second)
	// and the API burst die down before measuring.
	time.Sleep(b.settle)
	return nil
}

// client runs argv in case c's client pod on CPU 0, bounded in time.
func (b *bench) client(c *caseNet, argv ...string) ([]byte, error) {
	limit := strconv.Itoa(int(b.duration.Seconds()) + 30)
	full := inNetns(c.client, append([]string{"timeout", limit, "taskset", "-c", "0"}, argv...)...)
	record(full...)
	cmd := exec.CommandContext(b.ctx, full[0], full[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// stolen records the CPU time the hypervisor took from this machine during
// one measurement of case c, as METRIC_steal (ms, all CPUs), and logs it
// when it is large. Rates and tails follow it on a shared host: a
// repetition whose numbers stand out is read against this row.
func (b *bench) stolen(c, metric string, before benchrun.CPUTimes, n, rep int) {
	now, err := benchrun.ReadCPUTimes()
	if err != nil {
		log.Printf("  %-16s %s: steal not recorded: %v", c, metric, err)
		return
	}
	steal := now.Sub(before).Steal
	b.row(c, metric+"_steal", "ms", float64(steal.Milliseconds()), rep, n)
	if steal > b.duration/20 {
		log.Printf("  %-16s %s: the host took %v of this machine's CPU during the run (steal)", c, metric, steal)
	}
}

// rr runs sockperf ping-pong from c's client to target and records
// average, p50, p99, transactions/s and softirq per transaction as
// METRIC_avg etc.
func (b *bench) rr(c *caseNet, target, metric string, n, rep int) error {
	return b.rrAt(c, target, sockperfPort, metric, n, rep)
}

// rrAt is rr to another port than sockperf's own (a NodePort).
func (b *bench) rrAt(c *caseNet, target string, port int, metric string, n, rep int) error {
	t0, err := benchrun.ReadCPUTimes()
	if err != nil {
		return err
	}
	out, err := b.client(c, "sockperf", "ping-pong", "--tcp", "-i", target, "-p", strconv.Itoa(port),
		"-t", strconv.Itoa(int(b.duration.Seconds())), "--msg-size", strconv.Itoa(msgSize), "--full-rtt")
	t1, terr := benchrun.ReadCPUTimes()
	logPath := filepath.Join(b.out, fmt.Sprintf("sockperf-%s-%s-n%d-%d.log", c.name, metric, n, rep))
	os.WriteFile(logPath, out, 0o644)
	if err != nil {
		return fmt.Errorf("sockperf (log %s): %w", logPath, err)
	}
	if terr != nil {
		return terr
	}
	r, err := parseSockperf(out)
	if err != nil {
		return fmt.Errorf("%s: %w", logPath, err)
	}
	b.row(c.name, metric+"_avg", "us", r.avg, rep, n)
	b.row(c.name, metric+"_p50", "us", r.p50, rep, n)
	b.row(c.name, metric+"_p99", "us", r.p99, rep, n)
	b.row(c.name, metric+"_tps", "trans/s", r.tps, rep, n)
	softirq := float64(t1.Sub(t0).Softirq.Microseconds()) / r.received
	b.row(c.name, metric+"_softirq", "us", softirq, rep, n)
	b.stolen(c.name, metric, t0, n, rep)
	log.Printf("  %-16s %-6s avg %.1f µs p50 %.1f p99 %.1f, %.0f trans/s, softirq %.2f µs/trans (machine-wide)",
		c.name, metric, r.avg, r.p50, r.p99, r.tps, softirq)
	return nil
}

type sockperfResult struct{ avg, p50, p99, tps, received float64 }

// parseSockperf reads sockperf's summary: "avg-rtt=X", "---> percentile
// P = X", the transactions of the measured part ("[Valid Duration]") and
// of the whole run ("[Total Run]").
func parseSockperf(out []byte) (sockperfResult, error) {
	var r sockperfResult
	var found int
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.Contains(l, "avg-rtt="):
			v := strings.SplitN(l[strings.Index(l, "avg-rtt=")+len("avg-rtt="):], " ", 2)[0]
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				r.avg, found = f, found|1
			}
		case strings.Contains(l, "percentile 50.000 ="):
			f := strings.Fields(l)
			if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				r.p50, found = v, found|2
			}
		case strings.Contains(l, "percentile 99.000 ="):
			f := strings.Fields(l)
			if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				r.p99, found = v, found|4
			}
		case strings.Contains(l, "[Valid Duration]"):
			if secs, recv := runLine(l); secs > 0 && recv > 0 {
				r.tps, found = recv/secs, found|8
			}
		case strings.Contains(l, "[Total Run]"):
			// The whole run, warm-up included: what the softirq reading spans.
			if _, recv := runLine(l); recv > 0 {
				r.received, found = recv, found|16
			}
		}
	}
	if found != 31 {
		return r, fmt.Errorf("sockperf summary incomplete (avg-rtt, percentile 50/99, [Valid Duration], [Total Run]; found mask %b): output format changed?", found)
	}
	return r, nil
}

// runLine reads RunTime and ReceivedMessages from a line such as
// "[Valid Duration] RunTime=9.5 sec; SentMessages=1; ReceivedMessages=1".
func runLine(l string) (secs, received float64) {
	for _, kv := range strings.FieldsFunc(l, func(r rune) bool { return r == ';' || r == ' ' }) {
		k, v, ok := strings.Cut(kv, "=")
		switch {
		case !ok:
		case k == "RunTime":
			secs, _ = strconv.ParseFloat(v, 64)
		case k == "ReceivedMessages":
			received, _ = strconv.ParseFloat(v, 64)
		}
	}
	return secs, received
}

// measure runs every metric of case c once.
func (b *bench) measure(c string, n, rep int) error {
	if b.nodeport {
		return b.measureNodePort(c, n, rep)
	}
	cn := b.cases[c]
	servers := b.servers(cn)
	if err := b.rr(cn, servers[0], "rr_pod", n, rep); err != nil {
		return err
	}
	// Through the ClusterIP; the floor has no services, so its rr_svc is
	// a second run straight to the pod, the floor the others compare with.
	svc := b.measuredVIP(cn)
	if !cn.hasService {
		svc = servers[0]
	}
	if err := b.rr(cn, svc, "rr_svc", n, rep); err != nil {
		return err
	}
	// New connections: through the ClusterIP, or for the floor (no
	// services) straight to the same ten backends.
	target := b.measuredVIP(cn) + ":80"
	if !cn.hasService {
		var t []string
		for _, ip := range servers {
			t = append(t, net.JoinHostPort(ip, strconv.Itoa(servePort)))
		}
		target = strings.Join(t, ",")
	}
	if err := b.connRate(cn, target, "conn_rate", n, rep); err != nil {
		return err
	}
	return b.throughput(cn, servers[0], iperfPort, "throughput", n, rep)
}

// connRate measures new connections/s from cn's client to target
// (bench/cmd/connrate), then empties the nodes' conntrack tables (the
// kernel's: shunt's own BPF tables are not emptied, they keep closed
// connections' entries until their LRU evicts them, as on a real node).
// Beside the rate it logs the connections that stalled (connrate's counts:
// a connect of 900 ms or more waited for a retransmitted SYN, a
// request/reply of 190 ms or more for a retransmitted segment) and the
// client's TCP counters over the run, so that a rate that collapses with
// no connection failed says where the time went.
func (b *bench) connRate(cn *caseNet, target, metric string, n, rep int) error {
	before, cerr := tcpCounters(cn.client)
	serversBefore, serr := b.serverCounters(cn)
	progBefore := b.programStats(cn)
	cpu0, terr := benchrun.ReadCPUTimes()
	if terr != nil {
		return terr
	}
	var prof *profile
	if b.profile {
		prof = b.startProfile(fmt.Sprintf("%s-%s-n%d-%d", cn.name, metric, n, rep))
	}
	out, err := b.client(cn, filepath.Join(b.bin, "connrate"), "-target", target, "-workers", "4", "-duration", b.duration.String())
	if prof != nil {
		// Waited for even when the run failed: it ends within the run.
		shares, perr := prof.wait()
		if perr != nil && err == nil {
			return perr
		}
		if perr == nil {
			defer b.logProfile(cn.name, metric, n, rep, shares, prof.file)
		}
	}
	if err != nil {
		return err
	}
	var cr struct {
		Rate          float64
		Failed        int
		SlowConnects  int64   `json:"slow_connects"`
		SlowExchanges int64   `json:"slow_exchanges"`
		MaxConnectMs  float64 `json:"max_connect_ms"`
		MaxExchangeMs float64 `json:"max_exchange_ms"`
	}
	if err := json.Unmarshal(out, &cr); err != nil {
		return fmt.Errorf("connrate output %q: %w", out, err)
	}
	b.row(cn.name, metric, "conn/s", cr.Rate, rep, n)
	b.stolen(cn.name, metric, cpu0, n, rep)
	b.logProgramStats(cn.name, metric, n, rep, cr.Rate*b.duration.Seconds(), progBefore, b.programStats(cn))
	log.Printf("  %-16s %s %.0f new connections/s (%d failed; stalled: %d connects >= 900 ms, %d requests >= 190 ms; longest %.0f ms, %.0f ms)",
		cn.name, metric, cr.Rate, cr.Failed, cr.SlowConnects, cr.SlowExchanges, cr.MaxConnectMs, cr.MaxExchangeMs)
	if after, err := tcpCounters(cn.client); err == nil && cerr == nil {
		log.Printf("  %-16s %s: the client's TCP counters over the run: %s", cn.name, metric, countersMoved(before, after, clientTCPCounters))
	}
	if after, err := b.serverCounters(cn); err == nil && serr == nil {
		log.Printf("  %-16s %s: the server pods' TCP counters over the run (all of them): %s", cn.name, metric,
			countersMoved(serversBefore, after, serverTCPCounters))
	}
	// Closed connections stay in the NAT cases' conntrack tables (the node
	// namespaces'): clear them so the next case and repetition start alike.
	for _, ns := range cn.nodes {
		argv := []string{"nsenter", "--net=/run/netns/" + ns, "conntrack", "-F"}
		record(argv...)
		exec.Command(argv[0], argv[1:]...).Run()
	}
	return nil
}

// clientTCPCounters are the client's counters connRate reports (nstat's
// names): SYNs and segments retransmitted, timeouts, resets sent, and the
// TIME_WAIT sockets reused (tcp_tw_reuse) or not made because the table
// was full (net.ipv4.tcp_max_tw_buckets).
var clientTCPCounters = []string{"TcpExtTCPSynRetrans", "TcpRetransSegs", "TcpExtTCPTimeouts", "TcpOutRsts",
	"TcpExtTWRecycled", "TcpExtTCPTimeWaitOverflow"}

// serverTCPCounters are the server pods' counters connRate reports: the
// replies they retransmitted, the SYNs they dropped or challenged, the
// old sockets (PAWS) new SYNs met.
var serverTCPCounters = []string{"TcpRetransSegs", "TcpExtTCPTimeouts", "TcpOutRsts", "TcpExtListenOverflows",
	"TcpExtListenDrops", "TcpExtTCPChallengeACK", "TcpExtTCPSYNChallenge", "TcpExtPAWSEstab", "TcpEstabResets"}

// countersMoved names the counters of names that changed from before to
// after, with the change.
func countersMoved(before, after map[string]int64, names []string) string {
	var moved []string
	for _, name := range names {
		if d := after[name] - before[name]; d != 0 {
			moved = append(moved, fmt.Sprintf("%s %d", name, d))
		}
	}
	if len(moved) == 0 {
		return "none moved"
	}
	return strings.Join(moved, ", ")
}

// serverCounters sums the TCP counters of cn's server pods.
func (b *bench) serverCounters(cn *caseNet) (map[string]int64, error) {
	netns := cn.serverNetns
	if len(netns) == 0 {
		return nil, fmt.Errorf("%s: no server pods known", cn.name)
	}
	sum := map[string]int64{}
	for _, path := range netns {
		c, err := tcpCounters(path)
		if err != nil {
			return nil, err
		}
		for k, v := range c {
			sum[k] += v
		}
	}
	return sum, nil
}

// tcpCounters reads the TCP counters of the network namespace at path
// (/proc/net/snmp and /proc/net/netstat as seen from it), by nstat's names
// (the table's prefix and the counter: TcpRetransSegs, TcpExtTWRecycled).
func tcpCounters(path string) (map[string]int64, error) {
	raw, err := exec.Command("nsenter", "--net="+path, "cat", "/proc/net/snmp", "/proc/net/netstat").Output()
	if err != nil {
		return nil, fmt.Errorf("reading the TCP counters of %s: %w", path, err)
	}
	counters, err := parseCounters(string(raw))
	if err != nil {
		return nil, fmt.Errorf("the TCP counters of %s: %w", path, err)
	}
	return counters, nil
}

// parseCounters reads the tables of /proc/net/snmp and /proc/net/netstat:
// each two lines, "Prefix: name name ..." then "Prefix: value value ...".
func parseCounters(raw string) (map[string]int64, error) {
	counters := map[string]int64{}
	lines := strings.Split(strings.TrimSpace(raw), "\n")
	if len(lines)%2 != 0 {
		return nil, fmt.Errorf("%d lines: want a names line and a values line per table", len(lines))
	}
	for i := 0; i+1 < len(lines); i += 2 {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) != len(values) || len(names) == 0 || names[0] != values[0] {
			return nil, fmt.Errorf("unexpected lines %q, %q", lines[i], lines[i+1])
		}
		prefix := strings.TrimSuffix(names[0], ":")
		for j := 1; j < len(names); j++ {
			if v, err := strconv.ParseInt(values[j], 10, 64); err == nil {
				counters[prefix+names[j]] = v
			}
		}
	}
	return counters, nil
}

// throughput measures one iperf3 stream from cn's client to host:port.
func (b *bench) throughput(cn *caseNet, host string, port int, metric string, n, rep int) error {
	// iperf3's server takes one test at a time and needs a moment after
	// the previous one: retry.
	var gbps float64
	jsonPath := filepath.Join(b.out, fmt.Sprintf("iperf3-%s-%s-n%d-%d.json", cn.name, metric, n, rep))
	var cpu0 benchrun.CPUTimes
	for try := 1; ; try++ {
		var err error
		if cpu0, err = benchrun.ReadCPUTimes(); err != nil {
			return err
		}
		out, err := b.client(cn, "iperf3", "-c", host, "-p", strconv.Itoa(port), "-t", strconv.Itoa(int(b.duration.Seconds())), "-J")
		os.WriteFile(jsonPath, out, 0o644)
		var r struct {
			End struct {
				SumReceived struct {
					BitsPerSecond float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if err == nil && json.Unmarshal(out, &r) == nil && r.End.SumReceived.BitsPerSecond > 0 {
			gbps = r.End.SumReceived.BitsPerSecond / 1e9
			break
		}
		if try == 3 || b.ctx.Err() != nil {
			return fmt.Errorf("iperf3 failed 3 times (last output %s): %v", jsonPath, err)
		}
		time.Sleep(time.Second)
	}
	b.row(cn.name, metric, "Gbit/s", gbps, rep, n)
	b.stolen(cn.name, metric, cpu0, n, rep)
	log.Printf("  %-16s %s %.2f Gbit/s", cn.name, metric, gbps)
	return nil
}

// ports are the nodePorts measured name c measures (every case but
// shunt-native's two and shunt-vxlan-dsr: xbench's).
func (b *bench) ports(c string) *nodePorts {
	if p, ok := measuredPorts[c]; ok {
		return p
	}
	return measuredPorts[shunt]
}

// nodePortAddr is node i's address on case c's underlay with port.
func (b *bench) nodePortAddr(c *caseNet, i int, port int32) string {
	return net.JoinHostPort(b.underlayAddr(c.name, i), strconv.Itoa(int(port)))
}

// measureNodePort runs every metric of case c once from its external
// host: through node 1's NodePort (every backend on node 2: kube-proxy
// and shunt SNAT to the node) and node 2's (every backend there).
//
// shunt-native-dsr and shunt-vxlan-dsr are shunt-native's and
// shunt-vxlan's nodes through their DSR Services (rows of that name):
// through node 1 DSR, through node 2 the same path as SNAT's (the
// backends are there).
func (b *bench) measureNodePort(c string, n, rep int) error {
	cn := b.cases[nodesOf(c)]
	ext := *cn
	ext.client, ext.name = cn.ext[c], c // the rows are c's
	p := b.ports(c)
	for i, where := range []string{"remote", "local"} {
		if err := b.rrAt(&ext, b.underlayAddr(cn.name, i), int(p.sockperf), "rr_"+where, n, rep); err != nil {
			return err
		}
		// Through node 1 a DSR case's packets must leave by DSR.
		checkDSR := i == 0 && slices.Contains(dsrCases, c)
		var encapsBefore uint64
		if checkDSR {
			var err error
			if encapsBefore, err = b.dsrEncaps(cn); err != nil {
				return err
			}
		}
		if err := b.connRate(&ext, b.nodePortAddr(cn, i, p.serve), "conn_rate_"+where, n, rep); err != nil {
			return err
		}
		if checkDSR {
			// A DSR row must measure DSR: a Service the agent SNATs
			// instead (DSR unavailable, a mode not taken) would be
			// measured under the wrong name.
			after, err := b.dsrEncaps(cn)
			if err != nil {
				return err
			}
			if after == encapsBefore {
				return fmt.Errorf("case %s: node 1 encapsulated no packet for DSR during %s (its dsr-encap/from-uplink counter did not move): the Service was not taken by DSR; see `shunt --instance %s status` and its log", c, "conn_rate_"+where, cn.agents[0])
			}
			log.Printf("  %-16s conn_rate_%s: node 1 encapsulated %d packets for DSR", c, where, after-encapsBefore)
		}
	}
	return b.throughput(&ext, b.underlayAddr(cn.name, 0), int(p.iperf), "throughput_remote", n, rep)
}

// dsrEncaps is node 1's (the ingress node's) count of packets its uplink
// program sent to another node by DSR.
func (b *bench) dsrEncaps(cn *caseNet) (uint64, error) {
	var st struct {
		Counters []dpinfo.Counter `json:"counters"`
	}
	if err := b.agentStatus(cn.agents[0], &st); err != nil {
		return 0, fmt.Errorf("case %s: %w", cn.name, err)
	}
	for _, c := range st.Counters {
		if c.Reason == "dsr-encap" && c.Direction == "from-uplink" {
			return c.Packets, nil
		}
	}
	return 0, nil
}

// maglevDisruption writes maglev.md: the share of the flows on the other
// backends that the measured Service's table moves when one of its
// backends goes, for each backend removed, as the agents compute it
// (internal/maglev, the default size, the port's name as the seed).
func (b *bench) maglevDisruption() error {
	var names []string
	for _, ip := range b.serverIP {
		names = append(names, net.JoinHostPort(ip, strconv.Itoa(servePort)))
	}
	const port = "default/xbench:tcp"
	var w bytes.Buffer
	fmt.Fprintf(&w, "Maglev, the measured Service's port (%s, %d backends): removing one backend moves this share of the flows that were on the others (computed with internal/maglev as every agent computes it; kube-proxy picks a backend per connection at random, so a tuple's next connection lands elsewhere with probability (N-2)/(N-1) whatever is removed):\n\n", port, len(names))
	fmt.Fprintf(&w, "| M | mean | worst | removals |\n|---|---|---|---|\n")
	for _, m := range []int{1009, maglev.DefaultSize} {
		before, _, err := maglev.Compute(names, m, []byte(port))
		if err != nil {
			return err
		}
		sum, worst := 0.0, 0.0
		for i := range names {
			rest := slices.Delete(slices.Clone(names), i, i+1)
			after, _, err := maglev.Compute(rest, m, []byte(port))
			if err != nil {
				return err
			}
			f := maglev.Disruption(before, after, names[i])
			sum, worst = sum+f, max(worst, f)
		}
		fmt.Fprintf(&w, "| %d | %.2f%% | %.2f%% | %d |\n", m, 100*sum/float64(len(names)), 100*worst, len(names))
	}
	return os.WriteFile(filepath.Join(b.out, "maglev.md"), w.Bytes(), 0o644)
}

// splitList reads a comma-separated list ("" is none).
func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
