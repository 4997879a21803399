// Command k8sbench measures shunt against the real kube-proxy (iptables and
// nftables modes) on one real control plane (internal/kubecluster), side by
// side: every dataplane watches the same API server and programs the same
// Services. bench/k8s.sh runs it and turns its rows into the report.
//
// Layout, all on this machine, nothing in the host's own namespace:
//   - shunt: an agent (`shunt lab up --kubeconfig`) for Node shunt-node;
//     ten server pods and a client pod plumbed by shunt-cni (libcni), as a
//     runtime would; Pod objects carry their addresses.
//   - kube-proxy: one network namespace per mode, Node kp-<mode>; the same
//     ten endpoint addresses on its loopback device, served there,
//     and the client in that namespace (kube-proxy DNATs locally started
//     connections in nat OUTPUT). Its rules never leave that namespace.
//
// Services are selector-less, each with a hand-written EndpointSlice of the
// ten endpoints (port 8080), so every dataplane serves every service.
//
// Per scale N and repetition:
//   - cold_sync: create N Services + N slices (32 workers), then time until
//     the last one answers through each dataplane, from the end of the
//     creation (the API server's own time is reported as api_create);
//   - change_p50/p99: one more Service created, time to its first answered
//     connection through each dataplane (-changes samples);
//   - rss: resident memory of shuntd and of each kube-proxy right after the
//     sync; rss_settled: the same after -settle of quiet.
//
// Rows go to -rows as JSON lines in bench/lib.sh's format.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/netip"
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

	"github.com/shuntnet/shunt/bench/internal/benchrun"
	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/kubecluster"
	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/procstat"
)

const (
	coldStartCap = 2 * time.Minute
	serviceCIDR  = "10.96.0.0/16"
	clusterCIDR  = "10.221.0.0/16" // not crossnode's 10.252.0.0/16: smoke runs of the two overlap (bench/smoke_test.go)
	backendPort  = 8080
	endpoints    = 10
)

type bench struct {
	cs     kubernetes.Interface
	kc     *kubecluster.Cluster
	bin    string // directory of shunt binaries
	inst   string
	rows   *os.File
	mu     sync.Mutex
	undo   benchrun.Undo         // what the run built
	exited map[int]chan struct{} // closed when a process b.start ran is reaped
	// dataplanes by case name: the namespace their client dials from.
	clients     map[string]string
	pids        map[string]int
	backends    []string
	rateFor     time.Duration
	heapProfile string
	policies    int
	out         string // where the logs of the processes it starts go
	// kube-proxy modes measured beside shunt.
	kubeProxyModes []string
	settle         time.Duration
	restart        map[string]func() error // a cold start of each dataplane
}

func main() {
	var (
		scales            = flag.String("n", "1000,10000", "numbers of Services, comma-separated")
		reps              = flag.Int("reps", 3, "repetitions per scale")
		changes           = flag.Int("changes", 20, "single-Service changes timed per repetition")
		policies          = flag.Int("policies", 0, "NetworkPolicies created before measuring (selecting no pod: they weigh on the agent's memory, not on the paths measured)")
		duration          = flag.Duration("duration", 10*time.Second, "how long each new-connection rate runs")
		rowsPath, bin, id string
		out               string
		heapProfile       string
		kubeProxyModes    string
		settle            = flag.Duration("settle", 30*time.Second, "quiet time after the cold sync before the settled resident memory is read")
	)
	flag.StringVar(&rowsPath, "rows", "", "append result rows (JSON lines) here")
	flag.StringVar(&bin, "bin", "bin", "directory of shunt, shuntd, shunt-cni")
	flag.StringVar(&out, "out", "", "directory for the logs of the processes it starts (default: a new one under $TMPDIR, named at the start)")
	flag.StringVar(&heapProfile, "heap-profile", "", "after each cold sync, save shuntd's heap profile here (go tool pprof)")
	flag.StringVar(&kubeProxyModes, "kube-proxy", "iptables,nftables", "kube-proxy modes run beside shunt, comma-separated (empty: shunt alone, e.g. to study its memory)")
	flag.StringVar(&id, "id", strconv.Itoa(os.Getpid()), "suffix of every name this run creates")
	flag.Parse()
	log.SetFlags(log.Ltime)
	rows, err := os.OpenFile(rowsPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		log.Fatal(err)
	}
	b := &bench{rows: rows, clients: map[string]string{}, pids: map[string]int{}, restart: map[string]func() error{}, exited: map[int]chan struct{}{}, inst: "bk8s" + id}
	if b.bin, err = filepath.Abs(bin); err != nil {
		log.Fatal(err)
	}
	if out == "" {
		if out, err = os.MkdirTemp("", b.inst+"-logs"); err != nil {
			log.Fatal(err)
		}
		log.Printf("logs of the processes it starts: %s", out)
	} else if err := os.MkdirAll(out, 0o755); err != nil {
		log.Fatal(err)
	}
	b.out = out
	b.rateFor, b.heapProfile, b.policies, b.settle = *duration, heapProfile, *policies, *settle
	if kubeProxyModes != "" {
		b.kubeProxyModes = strings.Split(kubeProxyModes, ",")
	}
	// Interrupted, it still removes what it built (netns, lab, cluster).
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigs
		log.Print("interrupted: cleaning up")
		b.undo.Run()
		os.Exit(1)
	}()
	err = b.run(strings.Split(*scales, ","), *reps, *changes)
	b.undo.Run()
	if err != nil {
		log.Fatal(err)
	}
}

func (b *bench) row(c, metric, unit string, value float64, rep, n int) {
	benchrun.Row(b.rows, c, metric, unit, value, rep, n)
}

func sh(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// start runs a long-lived process; it is killed (by PID) at the end.
func (b *bench) start(logName string, name string, args ...string) (*exec.Cmd, error) {
	logf, err := os.Create(filepath.Join(b.out, b.inst+"-"+logName+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "PATH="+b.bin+":"+os.Getenv("PATH"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	b.mu.Lock()
	b.exited[cmd.Process.Pid] = exited
	b.mu.Unlock()
	b.undo.Add(func() { cmd.Process.Kill(); <-exited })
	return cmd, nil
}

func (b *bench) run(scales []string, reps, changes int) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", b.inst+"-cluster")
	if err != nil {
		return err
	}
	b.undo.Add(func() { os.RemoveAll(dir) })
	b.kc, err = kubecluster.Up(ctx, kubecluster.Options{Dir: dir, ServiceCIDR: serviceCIDR, ClusterCIDR: clusterCIDR, Logf: log.Printf})
	if err != nil {
		return err
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
		return err
	}
	if err := b.setupShunt(ctx); err != nil {
		return fmt.Errorf("shunt: %w", err)
	}
	for _, mode := range b.kubeProxyModes {
		if err := b.setupKubeProxy(ctx, mode); err != nil {
			return fmt.Errorf("kube-proxy %s: %w", mode, err)
		}
	}
	// Thousands of short connections a second from one client: let it
	// reuse TIME_WAIT ports, or every case after the first runs out.
	for _, ns := range b.clients {
		if err := sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1", "net.ipv4.ip_local_port_range=1024 65000"); err != nil {
			return err
		}
	}
	cases := slices.Sorted(func(yield func(string) bool) {
		for c := range b.clients {
			if !yield(c) {
				return
			}
		}
	})
	for _, s := range scales {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("-n %q: %w", s, err)
		}
		for rep := 1; rep <= reps; rep++ {
			if err := b.measure(ctx, cases, n, rep, changes); err != nil {
				return fmt.Errorf("N=%d rep %d: %w", n, rep, err)
			}
		}
	}
	return nil
}

// setupShunt starts the agent for shunt-node and plumbs its pods.
func (b *bench) setupShunt(ctx context.Context) error {
	if err := b.node(ctx, "shunt-node"); err != nil {
		return err
	}
	shunt := filepath.Join(b.bin, "shunt")
	if err := sh(shunt, "--instance", b.inst, "lab", "up", "--kubeconfig", b.kc.Kubeconfig, "--node-name", "shunt-node", "--service-cidr", serviceCIDR); err != nil {
		return err
	}
	b.undo.Add(func() { sh(shunt, "--instance", b.inst, "lab", "down") })
	// The lab plays the node's kubelet: pods created in the API run here,
	// plumbed by shunt-cni.
	pod := func(name string, command ...string) (string, error) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.PodSpec{NodeName: "shunt-node", Containers: []corev1.Container{{Name: "c", Image: "lab", Command: command}}}}
		if err := b.createPod(ctx, p); err != nil {
			return "", err
		}
		var ip string
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := b.cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			ip = got.Status.PodIP
			return got.Status.Phase == corev1.PodRunning && ip != "", nil
		})
		return ip, err
	}
	for i := range endpoints {
		ip, err := pod(fmt.Sprintf("server-%d", i), "taskset", "-c", "1", "shunt", "lab", "serve", "--tcp", strconv.Itoa(backendPort))
		if err != nil {
			return err
		}
		b.backends = append(b.backends, ip)
	}
	if _, err := pod("client", "sleep", "infinity"); err != nil {
		return err
	}
	b.clients["shunt"] = instance.Instance{Name: b.inst}.PodNetns("default", "client")
	var st struct{ PID int }
	out, err := exec.Command(shunt, "--instance", b.inst, "status", "-o", "json").Output()
	if err != nil {
		return err
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return err
	}
	b.pids["shunt"] = st.PID
	// A cold start of shunt's control path: the agent stopped and started
	// again; `lab up` returns once it listed every object and a sync
	// covered them (the maps stay pinned meanwhile, so the VIP keeps
	// answering: the time is the agent's, from start to programmed).
	b.restart["shunt"] = func() error {
		if err := b.stopPID(b.pids["shunt"]); err != nil {
			return err
		}
		if err := sh(shunt, "--instance", b.inst, "lab", "up", "--kubeconfig", b.kc.Kubeconfig, "--node-name", "shunt-node", "--service-cidr", serviceCIDR); err != nil {
			return err
		}
		out, err := exec.Command(shunt, "--instance", b.inst, "status", "-o", "json").Output()
		if err == nil {
			err = json.Unmarshal(out, &st)
		}
		b.pids["shunt"] = st.PID
		return err
	}
	return nil
}

// setupKubeProxy runs kube-proxy in its own namespace with the endpoints'
// addresses and servers there.
func (b *bench) setupKubeProxy(ctx context.Context, mode string) error {
	node := "kp-" + mode
	if err := b.node(ctx, node); err != nil {
		return err
	}
	ns := b.inst + "-" + node
	if err := sh("ip", "netns", "add", ns); err != nil {
		return err
	}
	b.undo.Add(func() { sh("ip", "netns", "del", ns) })
	if err := sh("ip", "-n", ns, "link", "set", "lo", "up"); err != nil {
		return err
	}
	// The same ten endpoint addresses as shunt's pods, each a pod of this
	// node: its own namespace on a veth, a /32 route to it, a server in
	// it. Plain routing, no BPF: what a kube-proxy node's pods look like.
	for i, ip := range b.backends {
		pod := fmt.Sprintf("%s-%d", ns, i)
		host := fmt.Sprintf("kpb%d", i)
		if err := sh("ip", "netns", "add", pod); err != nil {
			return err
		}
		b.undo.Add(func() { sh("ip", "netns", "del", pod) })
		for _, args := range [][]string{
			{"-n", ns, "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", pod},
			{"-n", ns, "link", "set", host, "up"},
			{"-n", ns, "route", "add", ip + "/32", "dev", host},
			{"-n", pod, "link", "set", "lo", "up"},
			{"-n", pod, "link", "set", "eth0", "up"},
			{"-n", pod, "addr", "add", ip + "/32", "dev", "eth0"},
			{"-n", pod, "route", "add", "default", "dev", "eth0"},
		} {
			if err := sh("ip", args...); err != nil {
				return err
			}
		}
		if _, err := b.start(fmt.Sprintf("%s-serve-%d", node, i), "ip", "netns", "exec", pod, "taskset", "-c", "1",
			filepath.Join(b.bin, "shunt"), "lab", "serve", "--tcp", strconv.Itoa(backendPort)); err != nil {
			return err
		}
	}
	// A route for the ClusterIPs, as a node has (its default route): the
	// socket needs one to connect before kube-proxy's nat OUTPUT rules
	// rewrite the destination. A veth pair inside the namespace carries it.
	for _, args := range [][]string{
		{"-n", ns, "link", "add", "kp0", "type", "veth", "peer", "name", "kp1"},
		{"-n", ns, "link", "set", "kp0", "up"}, {"-n", ns, "link", "set", "kp1", "up"},
		{"-n", ns, "addr", "add", "192.0.2.10/32", "dev", "kp0"},
		{"-n", ns, "route", "add", serviceCIDR, "dev", "kp0", "src", "192.0.2.10"},
	} {
		if err := sh("ip", args...); err != nil {
			return err
		}
	}
	// kube-proxy's namespace has its own loopback: a relay there carries
	// its API connections to the API server on the machine's loopback.
	if err := b.relay(ns); err != nil {
		return err
	}
	kc := filepath.Join(b.kc.Dir, node+".kubeconfig")
	if err := kubecluster.IssueKubeconfig(b.kc.Dir, kc, "system:kube-proxy"); err != nil {
		return err
	}
	kubeProxy := filepath.Join(b.kc.BinDir, "kube-proxy")
	c := "kube-proxy-" + mode
	start := func() error {
		cmd, err := b.start(node, "ip", "netns", "exec", ns, kubeProxy,
			"--kubeconfig", kc, "--hostname-override", node, "--proxy-mode", mode, "--cluster-cidr", clusterCIDR,
			"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "127.0.0.1:10256",
			"--conntrack-max-per-core", "0", "--conntrack-tcp-timeout-established", "0", "--conntrack-tcp-timeout-close-wait", "0")
		if err == nil {
			b.pids[c] = cmd.Process.Pid // ip netns exec execs kube-proxy: the same PID
		}
		return err
	}
	if err := start(); err != nil {
		return err
	}
	b.clients[c] = ns
	// A cold start: the running kube-proxy stopped, its rules removed, a
	// new one started.
	b.restart[c] = func() error {
		if err := b.stopPID(b.pids[c]); err != nil {
			return err
		}
		// Its rules removed: the namespace holds nothing else, so the
		// whole ruleset goes (`kube-proxy --cleanup` restores the iptables
		// table to do it, which itself takes minutes at 10 000 Services).
		if err := sh("ip", "netns", "exec", ns, "nft", "flush", "ruleset"); err != nil {
			return err
		}
		return start()
	}
	return nil
}

// stopPID stops a process this benchmark started (SIGTERM, then waits for
// it to exit: reaped by b.start's Wait or, for an agent, a zombie until
// init reaps it, which on some machines takes seconds; a zombie holds
// nothing any more).
func (b *bench) stopPID(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stopping pid %d: %w", pid, err)
	}
	b.mu.Lock()
	exited := b.exited[pid]
	b.mu.Unlock()
	if exited != nil {
		<-exited
		return nil
	}
	for procstat.Running(pid) {
		time.Sleep(10 * time.Millisecond)
	}
	return nil
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

func (b *bench) node(ctx context.Context, name string) error {
	_, err := b.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}}}}, metav1.CreateOptions{})
	return err
}

func (b *bench) createPod(ctx context.Context, p *corev1.Pod) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := b.cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "serviceaccount") {
			return false, nil
		}
		if err == nil {
			*p = *got
		}
		return err == nil, err
	})
}

// createService makes a selector-less Service and its slice; it returns
// the ClusterIP.
func (b *bench) createService(ctx context.Context, name string) (string, error) {
	svc, err := b.cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "tcp", Port: 80, TargetPort: intstr.FromInt32(backendPort)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	port, proto, pname, ready := int32(backendPort), corev1.ProtocolTCP, "tcp", true
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for _, ip := range b.backends {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	if _, err := b.cs.DiscoveryV1().EndpointSlices("default").Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	return svc.Spec.ClusterIP, nil
}

// deleteAll removes the benchmark's Services and slices.
func (b *bench) deleteAll(ctx context.Context) error {
	if err := b.cs.DiscoveryV1().EndpointSlices("default").DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName}); err != nil {
		return err
	}
	list, err := b.cs.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	return parallel(32, len(list.Items), func(i int) error {
		if list.Items[i].Name == "kubernetes" {
			return nil
		}
		err := b.cs.CoreV1().Services("default").Delete(ctx, list.Items[i].Name, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
}

func parallel(workers, n int, f func(int) error) error {
	var mu sync.Mutex
	var first error
	next := 0
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// answered waits until vip:80 answers from the namespace (a connect and a
// reply from the server), trying every millisecond; it returns when.
func answered(ctx context.Context, nsName, vip string) (time.Time, error) {
	var at time.Time
	err := netnsrun.Do("/run/netns/"+nsName, func() error {
		addr := netip.MustParseAddrPort(vip + ":80").String()
		for ctx.Err() == nil {
			c, err := net.DialTimeout("tcp", addr, 50*time.Millisecond)
			if err == nil {
				c.SetDeadline(time.Now().Add(200 * time.Millisecond))
				_, werr := c.Write([]byte("ping"))
				buf := make([]byte, 64)
				_, rerr := c.Read(buf)
				c.Close()
				if werr == nil && rerr == nil {
					at = time.Now()
					return nil
				}
			}
			time.Sleep(time.Millisecond)
		}
		return ctx.Err()
	})
	return at, err
}

// measure runs one repetition at scale n.
func (b *bench) measure(ctx context.Context, cases []string, n, rep, changes int) error {
	if err := b.deleteAll(ctx); err != nil {
		return err
	}
	time.Sleep(3 * time.Second) // let every dataplane drop them
	t0 := time.Now()
	vips := make([]string, n)
	if err := parallel(32, n-1, func(i int) error {
		var err error
		vips[i], err = b.createService(ctx, fmt.Sprintf("s%d", i))
		return err
	}); err != nil {
		return err
	}
	last, err := b.createService(ctx, "late")
	if err != nil {
		return err
	}
	created := time.Now()
	b.row("api-server", "api_create", "s", created.Sub(t0).Seconds(), rep, n)
	log.Printf("N=%d rep %d: %d Services and slices created in %s", n, rep, n, created.Sub(t0).Round(time.Millisecond))
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(cases))
	for _, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			at, err := answered(sctx, b.clients[c], last)
			if err != nil {
				// Recorded as the time waited (a lower bound), not fatal:
				// a dataplane that cannot keep up is a result.
				b.row(c, "cold_sync", "s", time.Since(created).Seconds(), rep, n)
				log.Printf("  %-20s NOT programmed %s after the last object (gave up)", c, time.Since(created).Round(time.Second))
				return
			}
			d := at.Sub(created)
			b.row(c, "cold_sync", "s", d.Seconds(), rep, n)
			log.Printf("  %-20s programmed %s after the last object", c, d.Round(time.Millisecond))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	for _, c := range cases {
		rss, err := rssMiB(b.pids[c])
		if err != nil {
			return fmt.Errorf("%s: %w", c, err)
		}
		b.row(c, "rss", "MiB", rss, rep, n)
	}
	// What each dataplane keeps once the burst is over: a node pays for
	// this all day, the peak above only while the objects stream in.
	time.Sleep(b.settle)
	for _, c := range cases {
		rss, err := rssMiB(b.pids[c])
		if err != nil {
			return fmt.Errorf("%s: %w", c, err)
		}
		b.row(c, "rss_settled", "MiB", rss, rep, n)
		anon, err := statusMiB(b.pids[c], "RssAnon:")
		if err != nil {
			return fmt.Errorf("%s: %w", c, err)
		}
		b.row(c, "rss_anon_settled", "MiB", anon, rep, n)
	}
	if b.heapProfile != "" {
		sock := instance.Instance{Name: b.inst}.Socket()
		if err := sh("curl", "-sSf", "--unix-socket", sock, "-o", b.heapProfile, "http://shuntd/debug/pprof/heap?gc=1"); err != nil {
			return err
		}
	}
	var latMu sync.Mutex
	lat := map[string][]float64{}
	for i := range changes {
		start := time.Now()
		vip, err := b.createService(ctx, fmt.Sprintf("change-%d", i))
		if err != nil {
			return err
		}
		committed := time.Now() // the API server holds the Service and its slice
		for _, c := range cases {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				at, err := answered(cctx, b.clients[c], vip)
				cancel()
				if err == nil {
					latMu.Lock()
					lat[c+"/"+strconv.Itoa(i)] = []float64{float64(at.Sub(start).Microseconds()) / 1000, float64(at.Sub(committed).Microseconds()) / 1000}
					latMu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	for _, c := range cases {
		var v, after []float64
		for i := range changes {
			if x, ok := lat[c+"/"+strconv.Itoa(i)]; ok {
				v, after = append(v, x[0]), append(after, x[1])
			}
		}
		if len(v) < changes {
			log.Printf("  %-20s %d of %d single changes never answered: no change latency recorded", c, changes-len(v), changes)
			continue
		}
		slices.Sort(v)
		slices.Sort(after)
		b.row(c, "change_p50", "ms", v[len(v)/2], rep, n)
		b.row(c, "change_p99", "ms", v[min(len(v)-1, len(v)*99/100)], rep, n)
		// Without the API server's own time (the two create calls).
		b.row(c, "committed_to_answer_p50", "ms", after[len(after)/2], rep, n)
		b.row(c, "committed_to_answer_p99", "ms", after[min(len(after)-1, len(after)*99/100)], rep, n)
		log.Printf("  %-20s one change: p50 %.1f ms, max %.1f ms", c, v[len(v)/2], v[len(v)-1])
	}
	// New connections through the late ClusterIP, one dataplane at a time.
	for _, c := range cases {
		out, err := exec.Command("ip", "netns", "exec", b.clients[c], "taskset", "-c", "0",
			filepath.Join(b.bin, "connrate"), "-target", last+":80", "-workers", "4", "-duration", b.rateFor.String()).Output()
		if err != nil {
			return fmt.Errorf("%s: connrate: %w", c, err)
		}
		var r struct{ Rate float64 }
		if err := json.Unmarshal(out, &r); err != nil {
			return fmt.Errorf("%s: connrate output %q: %w", c, out, err)
		}
		b.row(c, "conn_rate", "conn/s", r.Rate, rep, n)
		log.Printf("  %-20s %.0f new connections/s through the ClusterIP", c, r.Rate)
		// The NAT baselines fill the namespace's conntrack table.
		exec.Command("ip", "netns", "exec", b.clients[c], "conntrack", "-F").Run()
	}
	// Last, as it leaves a kube-proxy busy for minutes at 10 000 Services:
	// a cold start of each dataplane.
	for _, c := range cases {
		t0 := time.Now()
		if err := b.restart[c](); err != nil {
			return fmt.Errorf("%s: restart: %w", c, err)
		}
		if c != "shunt" {
			// Capped: kube-proxy's iptables mode restores its whole table at
			// start, which takes minutes at 10 000 Services with Debian's
			// iptables (nft backend). The cap is recorded, as a lower bound.
			cctx, cancel := context.WithTimeout(ctx, coldStartCap)
			_, err := answered(cctx, b.clients[c], last)
			cancel()
			if err != nil {
				log.Printf("  %-20s cold start with %d Services: NOT programmed after %s (gave up; recorded as %s)", c, n, coldStartCap, coldStartCap)
			}
		}
		d := time.Since(t0)
		b.row(c, "cold_start", "s", d.Seconds(), rep, n)
		log.Printf("  %-20s cold start with %d Services: %s", c, n, d.Round(time.Millisecond))
	}
	return nil
}

func rssMiB(pid int) (float64, error) { return statusMiB(pid, "VmRSS:") }

// statusMiB reads one memory line of /proc/PID/status (VmRSS: all resident
// pages; RssAnon: the heap and stacks, without the binary's mapped code).
func statusMiB(pid int, field string) (float64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field {
			kb, err := strconv.ParseFloat(f[1], 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no %s for pid %d", field, pid)
}

// createPolicies creates b.policies NetworkPolicies shaped like real ones
// (a pod selector, peers by pod and namespace selector and by ipBlock,
// ports) that select no pod of the benchmark.
func (b *bench) createPolicies(ctx context.Context) error {
	tcp, port := corev1.ProtocolTCP, intstr.FromInt32(80)
	return parallel(16, b.policies, func(i int) error {
		np := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i)},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"bench-policy": strconv.Itoa(i)}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{
						{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("client-%d", i)}}},
						{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("t%d", i%50)}}},
						{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("172.%d.%d.0/24", 16+i/256%16, i%256)}},
					},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
				}},
			},
		}
		_, err := b.cs.NetworkingV1().NetworkPolicies("default").Create(ctx, np, metav1.CreateOptions{})
		return err
	})
}
