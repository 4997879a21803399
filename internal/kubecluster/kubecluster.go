// Package kubecluster runs a real Kubernetes control plane on loopback for
// tests, benchmarks and `shunt dev cluster`: etcd (Debian's etcd-server),
// kube-apiserver and kube-controller-manager (built by scripts/kube-build.sh).
// There is no scheduler and no kubelet: pods name their node in
// spec.nodeName, and whoever plays the kubelet (the lab, a test) writes their
// status. ClusterIPs come from the real API server, spec.podCIDR of Nodes from
// the real node IPAM controller and EndpointSlices from the real EndpointSlice
// controller. With Options.NodeLifecycle, nodes that stop heartbeating or are
// deleted leave the cluster as in Kubernetes (NodeLifecycleControllers).
//
// Everything of one cluster lives in one directory: certificates, etcd's data,
// logs, the admin kubeconfig and cluster.json, which records the PIDs so that
// Down stops exactly the processes Up started.
package kubecluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/lbipam"
)

// DefaultClusterCIDR is the range node IPAM cuts one /24 per Node out of:
// the lab's default node pod CIDR (instance.DefaultPodCIDR, 10.244.0.0/24)
// is the first of them.
const DefaultClusterCIDR = "10.244.0.0/16"

// NodeCIDRMaskSize is the size of each Node's spec.podCIDR, as in the lab.
const NodeCIDRMaskSize = 24

// Options say where and how to run a control plane.
type Options struct {
	// Dir holds everything of the cluster; created, must not hold a
	// running cluster.
	Dir string
	// BinDir has kube-apiserver and kube-controller-manager;
	// DefaultBinDir() when empty.
	BinDir string
	// ServiceCIDR is --service-cluster-ip-range; the lab's
	// instance.DefaultServiceCIDR when empty.
	ServiceCIDR string
	// ClusterCIDR is what Nodes' pod CIDRs are allocated from;
	// DefaultClusterCIDR when empty.
	ClusterCIDR string
	// NodeLifecycle runs NodeLifecycleControllers: a Node whose heartbeat
	// (its Lease in kube-node-lease, its Ready condition) stops for
	// NodeMonitorGracePeriod becomes Ready=Unknown, its pods not ready
	// (out of every Service's endpoints) and, past their toleration of
	// the taint (300 s by default), evicted; a deleted Node's pods are
	// deleted. Only for clusters whose Nodes heartbeat (a kubelet, or an
	// agent that plays it: shuntd --run-pods): a Node nobody heartbeats
	// goes Unknown, and its pods not ready, a minute after it is created
	// (--node-startup-grace-period).
	NodeLifecycle bool
	// NodeMonitorGracePeriod is the controller-manager's
	// --node-monitor-grace-period (NodeLifecycle); Kubernetes' default
	// when zero. It must exceed the Lease's renewal interval several
	// times over (kubelet renews every 10 s).
	NodeMonitorGracePeriod time.Duration
	// Scheduler runs kube-scheduler (scripts/kube-build.sh kube-scheduler
	// builds it), which places pods by their nodeSelector, affinity and
	// resources; without it pods name their node, or a lab kubelet binds
	// them to its own.
	Scheduler bool
	// WorkloadControllers also runs the controllers of the workload APIs
	// (WorkloadControllers: ReplicationControllers, ReplicaSets,
	// Deployments, DaemonSets, Jobs, StatefulSets) and the Endpoints
	// controller, as the Kubernetes e2e suites expect of a cluster.
	WorkloadControllers bool
	// LoadBalancerPool, when valid, is where LoadBalancer Services get
	// their address: LoadBalancerController (`shunt dev lb-ipam`, the
	// program and its first arguments) runs as a component of the cluster,
	// with --kubeconfig and --pool added, as Cilium's LB-IPAM or MetalLB
	// in a real cluster (internal/lbipam). Without it, a LoadBalancer
	// Service stays pending (shunt's agents serve whatever address a
	// controller writes).
	LoadBalancerPool       netip.Prefix
	LoadBalancerController []string
	// Detach lets the processes outlive the caller (a CLI); otherwise
	// they die with it (tests).
	Detach bool
	// Logf reports progress; nil is silent.
	Logf func(format string, args ...any)
}

// Cluster is a running control plane.
type Cluster struct {
	Dir string
	// Kubeconfig is the admin's kubeconfig (group system:masters).
	Kubeconfig string
	// Server is the API server's URL, https://127.0.0.1:PORT.
	Server      string
	ServiceCIDR string
	ClusterCIDR string
	// BinDir has the Kubernetes binaries, kubectl and kube-proxy included.
	BinDir string

	restConfig *rest.Config
	procs      []*proc
	// How the API server was started, so a test can stop and restart it
	// alone (an outage): binary, arguments, log.
	apiBin, apiLog string
	apiArgs        []string
}

// Files in the cluster directory.
const (
	caFile              = "ca.crt"
	caKeyFile           = "ca.key"
	apiserverCertFile   = "apiserver.crt"
	apiserverKeyFile    = "apiserver.key"
	saKeyFile           = "service-account.key"
	saPubFile           = "service-account.pub"
	frontProxyCAFile    = "front-proxy-ca.crt"
	proxyClientCertFile = "front-proxy-client.crt"
	proxyClientKeyFile  = "front-proxy-client.key"
	kcmKubeconfigFile   = "controller-manager.kubeconfig"
	// The API server's client certificate towards kubelets.
	kubeletClientCertFile = "apiserver-kubelet-client.crt"
	kubeletClientKeyFile  = "apiserver-kubelet-client.key"
	// KubeconfigFile is the admin kubeconfig in the cluster directory.
	KubeconfigFile = "kubeconfig"
)

// startTimeout bounds each component's start; the API server takes a few
// seconds on an idle machine, much longer on 2 busy cores.
const startTimeout = 2 * time.Minute

// Up starts etcd, kube-apiserver and kube-controller-manager on free
// loopback ports and returns once the API server is ready and the
// controllers work (the service-account controller has made the default
// namespace's ServiceAccount). On error everything started is stopped; the
// directory stays for its logs (Down removes it). Up in the directory of a
// stopped cluster starts it again on its etcd data, with new certificates.
func Up(ctx context.Context, o Options) (*Cluster, error) {
	if o.Dir == "" {
		return nil, errors.New("kubecluster: no directory given")
	}
	if o.BinDir == "" {
		o.BinDir = DefaultBinDir()
	}
	if o.ServiceCIDR == "" {
		o.ServiceCIDR = instance.DefaultServiceCIDR
	}
	if o.ClusterCIDR == "" {
		o.ClusterCIDR = DefaultClusterCIDR
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.LoadBalancerPool.IsValid() {
		if err := lbipam.CheckPool(o.LoadBalancerPool); err != nil {
			return nil, err
		}
		if len(o.LoadBalancerController) == 0 {
			return nil, errors.New("kubecluster: a load balancer pool without a controller to run (Options.LoadBalancerController)")
		}
	}
	if err := CheckBinaries(o.BinDir); err != nil {
		return nil, err
	}
	etcd, err := etcdPath()
	if err != nil {
		return nil, err
	}
	if o.BinDir, err = filepath.Abs(o.BinDir); err != nil {
		return nil, err
	}
	_, svcNet, err := net.ParseCIDR(o.ServiceCIDR)
	if err != nil {
		return nil, fmt.Errorf("service CIDR %q: %w", o.ServiceCIDR, err)
	}
	if _, _, err := net.ParseCIDR(o.ClusterCIDR); err != nil {
		return nil, fmt.Errorf("cluster CIDR %q: %w", o.ClusterCIDR, err)
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, err
	}
	if s, err := readState(dir); err == nil && s.anyAlive() {
		return nil, fmt.Errorf("a cluster is already running in %s: stop it first (shunt dev cluster down --dir %s)", dir, dir)
	}
	for _, d := range []string{dir, filepath.Join(dir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("creating the cluster directory: %w", err)
		}
	}

	c := &Cluster{Dir: dir, Kubeconfig: filepath.Join(dir, KubeconfigFile), ServiceCIDR: o.ServiceCIDR, ClusterCIDR: o.ClusterCIDR, BinDir: o.BinDir}
	st := &state{KubeVersion: KubeVersion, Kubeconfig: c.Kubeconfig, ServiceCIDR: o.ServiceCIDR, ClusterCIDR: o.ClusterCIDR, BinDir: o.BinDir}
	ready := false
	defer func() {
		if !ready {
			c.Stop()
		}
	}()
	// run starts one component and records it before anything can fail.
	run := func(name, bin string, args []string) (*proc, error) {
		p, err := start(name, bin, args, filepath.Join(dir, "logs", name+".log"), o.Detach)
		if err != nil {
			return nil, err
		}
		c.procs = append(c.procs, p)
		st.Components = append(st.Components, p.component)
		return p, st.write(dir)
	}

	p, err := newPKI()
	if err != nil {
		return nil, err
	}
	// The API server's certificate names every way it is reached: loopback
	// from this machine, the first service address and the in-cluster names
	// from pods.
	kubernetesIP := firstIP(svcNet)
	serving, err := p.issue("kube-apiserver", nil,
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, kubernetesIP},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	if err != nil {
		return nil, err
	}
	admin, err := p.issue("shunt-admin", []string{"system:masters"}, nil, nil)
	if err != nil {
		return nil, err
	}
	kcm, err := p.issue("system:kube-controller-manager", nil, nil, nil)
	if err != nil {
		return nil, err
	}
	// What the API server shows kubelets when it proxies exec, logs,
	// attach and port-forward to them, as kubeadm issues it (a cluster
	// admin's group): a kubelet checks it against this CA.
	kubeletClient, err := p.issue("kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil)
	if err != nil {
		return nil, err
	}
	saKey, saPub, err := newSigningKey()
	if err != nil {
		return nil, err
	}
	// The front-proxy CA, as kubeadm sets it up: the API server signs its
	// requests to aggregated API servers with proxyClient, and the
	// controller-manager reads this CA from the extension-apiserver-
	// authentication ConfigMap (it logs an error every few seconds without).
	frontProxy, err := newPKI()
	if err != nil {
		return nil, err
	}
	proxyClient, err := frontProxy.issue("front-proxy-client", nil, nil, nil)
	if err != nil {
		return nil, err
	}
	caKey, err := p.keyPEM()
	if err != nil {
		return nil, err
	}
	if err := writeFiles(dir, map[string][]byte{
		caFile: p.caPEM, caKeyFile: caKey, apiserverCertFile: serving.cert, apiserverKeyFile: serving.key, saKeyFile: saKey, saPubFile: saPub,
		frontProxyCAFile: frontProxy.caPEM, proxyClientCertFile: proxyClient.cert, proxyClientKeyFile: proxyClient.key,
		kubeletClientCertFile: kubeletClient.cert, kubeletClientKeyFile: kubeletClient.key,
	}); err != nil {
		return nil, fmt.Errorf("writing certificates: %w", err)
	}

	// etcd
	etcdPort, err := freePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	o.Logf("starting etcd on %s", etcdURL)
	etcdProc, err := run("etcd", etcd, []string{
		"--name=shunt", "--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + etcdURL, "--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=shunt=" + peerURL, "--initial-cluster-state=new",
		"--logger=zap", "--log-outputs=stderr",
	})
	if err != nil {
		return nil, err
	}
	plain := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}
	defer plain.CloseIdleConnections()
	if err := waitHealthy(ctx, etcdProc, plain, etcdURL+"/health"); err != nil {
		return nil, err
	}

	// kube-apiserver
	apiPort, err := freePort()
	if err != nil {
		return nil, err
	}
	c.Server = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	st.Server = c.Server
	o.Logf("starting kube-apiserver %s on %s", KubeVersion, c.Server)
	c.apiBin, c.apiLog = filepath.Join(o.BinDir, "kube-apiserver"), filepath.Join(dir, "logs", "kube-apiserver.log")
	c.apiArgs = []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(apiPort),
		"--advertise-address=127.0.0.1",
		// The reconciler would publish 127.0.0.1 as the endpoint of the
		// kubernetes Service, which EndpointSlice validation refuses;
		// nothing here reaches the API server through its ClusterIP.
		"--endpoint-reconciler-type=none",
		"--tls-cert-file=" + filepath.Join(dir, apiserverCertFile),
		"--tls-private-key-file=" + filepath.Join(dir, apiserverKeyFile),
		"--client-ca-file=" + filepath.Join(dir, caFile),
		"--service-cluster-ip-range=" + o.ServiceCIDR,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(dir, saPubFile),
		"--service-account-signing-key-file=" + filepath.Join(dir, saKeyFile),
		"--requestheader-client-ca-file=" + filepath.Join(dir, frontProxyCAFile),
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + filepath.Join(dir, proxyClientCertFile),
		"--proxy-client-key-file=" + filepath.Join(dir, proxyClientKeyFile),
		// No --kubelet-certificate-authority, as kubeadm leaves it: a
		// lab kubelet serves a certificate of the cluster's CA once its
		// request is signed (kube-controller-manager's signer below),
		// its own self-signed one until then.
		"--kubelet-client-certificate=" + filepath.Join(dir, kubeletClientCertFile),
		"--kubelet-client-key=" + filepath.Join(dir, kubeletClientKeyFile),
		"--authorization-mode=Node,RBAC",
		"--allow-privileged=true",
		"--profiling=false",
	}
	apiProc, err := run("kube-apiserver", c.apiBin, c.apiArgs)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.caCert)
	adminTLS, err := tls.X509KeyPair(admin.cert, admin.key)
	if err != nil {
		return nil, err
	}
	api := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{adminTLS},
	}}}
	defer api.CloseIdleConnections()
	if err := waitHealthy(ctx, apiProc, api, c.Server+"/readyz"); err != nil {
		return nil, err
	}
	if err := writeKubeconfig(c.Kubeconfig, c.Server, p.caPEM, admin, "shunt-admin"); err != nil {
		return nil, err
	}
	if err := writeKubeconfig(filepath.Join(dir, kcmKubeconfigFile), c.Server, p.caPEM, kcm, "kube-controller-manager"); err != nil {
		return nil, err
	}
	c.restConfig = &rest.Config{
		Host: c.Server,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: p.caPEM, CertData: admin.cert, KeyData: admin.key,
		},
		// Tests and benchmarks create thousands of objects; the client's
		// default 5 QPS would measure the client, not the cluster.
		QPS: 1000, Burst: 2000,
	}

	// kube-controller-manager
	kcmPort, err := freePort()
	if err != nil {
		return nil, err
	}
	o.Logf("starting kube-controller-manager")
	kcmProc, err := run("kube-controller-manager", filepath.Join(o.BinDir, "kube-controller-manager"), controllerManagerArgs(o, dir, kcmPort))
	if err != nil {
		return nil, err
	}
	// Its serving certificate is self-signed in --cert-dir; this probe
	// only asks a loopback port we just opened whether it is healthy.
	insecure := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer insecure.CloseIdleConnections()
	if err := waitHealthy(ctx, kcmProc, insecure, "https://127.0.0.1:"+strconv.Itoa(kcmPort)+"/healthz"); err != nil {
		return nil, err
	}
	if err := c.waitDefaultServiceAccount(ctx, kcmProc); err != nil {
		return nil, err
	}
	if o.Scheduler {
		if err := c.startScheduler(ctx, o, run); err != nil {
			return nil, err
		}
	}
	if o.LoadBalancerPool.IsValid() {
		o.Logf("starting the load balancer controller: addresses from %s", o.LoadBalancerPool)
		args := append(slices.Clone(o.LoadBalancerController[1:]), "--kubeconfig", c.Kubeconfig, "--pool", o.LoadBalancerPool.String())
		if _, err := run("lb-ipam", o.LoadBalancerController[0], args); err != nil {
			return nil, err
		}
	}
	o.Logf("control plane ready: kubeconfig %s", c.Kubeconfig)
	ready = true
	return c, nil
}

// controllerManagerArgs are kube-controller-manager's flags for a cluster
// in dir, serving its health on port.
func controllerManagerArgs(o Options, dir string, port int) []string {
	kubeconfig := filepath.Join(dir, kcmKubeconfigFile)
	controllers := slices.Clone(Controllers)
	if o.NodeLifecycle {
		controllers = append(controllers, NodeLifecycleControllers...)
	}
	if o.WorkloadControllers {
		controllers = append(controllers, WorkloadControllers...)
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig, "--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(dir, "controller-manager"),
		"--leader-elect=false",
		// Each controller talks to the API server as its own service
		// account, with the RBAC roles a real cluster gives it.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + filepath.Join(dir, saKeyFile),
		"--root-ca-file=" + filepath.Join(dir, caFile),
		"--allocate-node-cidrs=true",
		"--cluster-cidr=" + o.ClusterCIDR,
		"--node-cidr-mask-size=" + strconv.Itoa(NodeCIDRMaskSize),
		"--service-cluster-ip-range=" + o.ServiceCIDR,
		"--controllers=" + strings.Join(controllers, ","),
		// Kubelets' serving certificates (CSRs of signer
		// kubernetes.io/kubelet-serving), from the cluster's CA.
		"--cluster-signing-kubelet-serving-cert-file=" + filepath.Join(dir, caFile),
		"--cluster-signing-kubelet-serving-key-file=" + filepath.Join(dir, caKeyFile),
		"--profiling=false",
	}
	if o.NodeLifecycle && o.NodeMonitorGracePeriod > 0 {
		args = append(args, "--node-monitor-grace-period="+o.NodeMonitorGracePeriod.String())
	}
	return args
}

// Controllers are the kube-controller-manager controllers every cluster
// runs: what shunt needs from a control plane. NodeLifecycleControllers
// come with Options.NodeLifecycle.
var Controllers = []string{
	"serviceaccount-token-controller",
	"serviceaccount-controller",
	"root-ca-certificate-publisher-controller",
	"namespace-controller",
	"garbage-collector-controller",
	"endpointslice-controller",
	"endpointslice-mirroring-controller",
	"node-ipam-controller",
	"service-cidr-controller",
	// Signs the serving certificates lab kubelets ask for (their API's).
	"certificatesigningrequest-signing-controller",
}

// NodeLifecycleControllers remove from the cluster a node that goes away,
// as in Kubernetes: the node-lifecycle controller watches the nodes'
// heartbeats (Leases and Ready conditions), marks a silent node
// Ready=Unknown and its pods not ready, and taints it (NoExecute); the
// taint-eviction controller evicts the pods that do not tolerate the taint
// (the API server's DefaultTolerationSeconds admission gives every pod
// 300 s); the pod garbage collector deletes the pods of a Node that was
// deleted (after a 40 s quarantine, checked every 20 s).
var NodeLifecycleControllers = []string{
	"node-lifecycle-controller",
	"taint-eviction-controller",
	"pod-garbage-collector-controller",
}

// WorkloadControllers come with Options.WorkloadControllers.
var WorkloadControllers = []string{
	"replicationcontroller-controller",
	"replicaset-controller",
	"deployment-controller",
	"daemonset-controller",
	"job-controller",
	"statefulset-controller",
	"endpoints-controller",
	"disruption-controller",
}

// schedulerKubeconfigFile is kube-scheduler's, as user system:kube-scheduler
// (the RBAC a real cluster gives it).
const schedulerKubeconfigFile = "scheduler.kubeconfig"

// startScheduler runs kube-scheduler and waits until it is healthy.
func (c *Cluster) startScheduler(ctx context.Context, o Options, run func(name, bin string, args []string) (*proc, error)) error {
	bin := filepath.Join(o.BinDir, "kube-scheduler")
	if st, err := os.Stat(bin); err != nil || st.Mode()&0o111 == 0 {
		return fmt.Errorf("kube-scheduler %s is not built in %s: run scripts/kube-build.sh kube-scheduler", KubeVersion, o.BinDir)
	}
	kubeconfig := filepath.Join(c.Dir, schedulerKubeconfigFile)
	if err := IssueKubeconfig(c.Dir, kubeconfig, "system:kube-scheduler"); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	o.Logf("starting kube-scheduler")
	p, err := run("kube-scheduler", bin, []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig, "--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(c.Dir, "scheduler"),
		"--leader-elect=false",
		"--profiling=false",
	})
	if err != nil {
		return err
	}
	insecure := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer insecure.CloseIdleConnections()
	return waitHealthy(ctx, p, insecure, "https://127.0.0.1:"+strconv.Itoa(port)+"/healthz")
}

// IssueKubeconfig writes a kubeconfig for user (in groups) of the cluster in
// dir, with a client certificate signed by its CA: kube-proxy runs as
// system:kube-proxy, an agent as its own user, each with the RBAC a real
// cluster gives it, not as the admin.
func IssueKubeconfig(dir, path, user string, groups ...string) error {
	s, err := readState(dir)
	if err != nil {
		return fmt.Errorf("no cluster in %s: %w", dir, err)
	}
	p, err := loadPKI(dir)
	if err != nil {
		return fmt.Errorf("reading the CA of the cluster in %s: %w", dir, err)
	}
	kp, err := p.issue(user, groups, nil, nil)
	if err != nil {
		return err
	}
	return writeKubeconfig(path, s.Server, p.caPEM, kp, user)
}

// RESTConfig is the admin's client configuration.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.restConfig) }

// Clientset is a client-go clientset as the admin.
func (c *Cluster) Clientset() (*kubernetes.Clientset, error) {
	return kubernetes.NewForConfig(c.RESTConfig())
}

// Kubectl is the path of the kubectl built with the cluster's binaries.
func (c *Cluster) Kubectl() string { return filepath.Join(c.BinDir, "kubectl") }

// Apply runs `kubectl apply -f` as the admin on each path (a file, a
// folder, or "-" for manifests), then waits until every
// CustomResourceDefinition of the cluster is established: served, so that
// objects of its kind can be created at once.
func (c *Cluster) Apply(ctx context.Context, manifests io.Reader, paths ...string) error {
	kubectl := func(stdin io.Reader, args ...string) error {
		cmd := exec.CommandContext(ctx, c.Kubectl(), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
		cmd.Stdin = stdin
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	for _, p := range paths {
		if err := kubectl(manifests, "apply", "-f", p); err != nil {
			return err
		}
	}
	return c.WaitCRDsEstablished(ctx)
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// WaitCRDsEstablished waits (up to a minute) until every
// CustomResourceDefinition of the cluster has condition Established=True.
// Not `kubectl wait --for condition=established crd --all`: that fails at
// once, instead of waiting, on a CRD created a moment before whose status
// has no conditions yet (".status.conditions accessor error: <nil>").
func (c *Cluster) WaitCRDsEstablished(ctx context.Context) error {
	client, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		return err
	}
	var waiting []string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.Resource(crdResource).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil // the API server may be settling; the timeout says when to stop
		}
		waiting = waiting[:0]
		for _, crd := range list.Items {
			if !crdEstablished(crd.Object) {
				waiting = append(waiting, crd.GetName())
			}
		}
		return len(waiting) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("custom resource definitions not established after a minute: %s: %w", strings.Join(waiting, ", "), err)
	}
	return nil
}

// crdEstablished reads status.conditions[type=Established].status of a
// CustomResourceDefinition; a missing status is not established yet.
func crdEstablished(crd map[string]any) bool {
	conditions, _, _ := unstructured.NestedSlice(crd, "status", "conditions")
	for _, c := range conditions {
		cond, _ := c.(map[string]any)
		if cond["type"] == "Established" {
			return cond["status"] == "True"
		}
	}
	return false
}

// StopAPIServer stops the API server alone (etcd and the controller-manager
// keep running), as an outage would. Tests only: the cluster directory's
// state file is not updated.
func (c *Cluster) StopAPIServer() error {
	for i, p := range c.procs {
		if p.Name != "kube-apiserver" {
			continue
		}
		if err := p.stop(10 * time.Second); err != nil {
			return err
		}
		<-p.exited
		c.procs = append(c.procs[:i], c.procs[i+1:]...)
		return nil
	}
	return errors.New("the API server is not running")
}

// StartAPIServer starts the API server again, on the same address with the
// same certificates, and waits until it is ready.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	p, err := start("kube-apiserver", c.apiBin, c.apiArgs, c.apiLog, false)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	hc, err := rest.HTTPClientFor(c.restConfig)
	if err != nil {
		return err
	}
	defer hc.CloseIdleConnections()
	return waitHealthy(ctx, p, hc, c.Server+"/readyz")
}

// Stop stops the processes this Cluster started, by PID, last started
// first. The directory stays.
func (c *Cluster) Stop() error {
	var errs []error
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		if err := p.stop(10 * time.Second); err != nil {
			errs = append(errs, err)
			continue
		}
		<-p.exited
	}
	c.procs = nil
	return errors.Join(errs...)
}

// Down stops the cluster recorded in dir, by PID, and removes dir. It is
// idempotent: a directory that is already gone is fine.
func Down(dir string) error {
	s, err := readState(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if _, statErr := os.Stat(dir); errors.Is(statErr, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("%s has no %s: not a cluster directory, leaving it alone", dir, stateFile)
	}
	if err != nil {
		return err
	}
	var errs []error
	for i := len(s.Components) - 1; i >= 0; i-- {
		if err := s.Components[i].stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w (%s kept)", err, dir)
	}
	return os.RemoveAll(dir)
}

// ComponentStatus is one process of a cluster, as Status sees it.
type ComponentStatus struct {
	Name    string
	PID     int
	Running bool
	Log     string
}

// Status reports what runs of the cluster recorded in dir.
type Status struct {
	Dir         string
	Server      string
	Kubeconfig  string
	KubeVersion string
	// BinDir has the cluster's binaries, kubectl among them.
	BinDir     string
	Components []ComponentStatus
}

// Running says whether every component runs.
func (s Status) Running() bool {
	for _, c := range s.Components {
		if !c.Running {
			return false
		}
	}
	return len(s.Components) > 0
}

// ReadStatus reads the cluster recorded in dir and checks its processes.
func ReadStatus(dir string) (Status, error) {
	s, err := readState(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return Status{}, fmt.Errorf("no cluster in %s: start one with shunt dev cluster up --dir %s", dir, dir)
	}
	if err != nil {
		return Status{}, err
	}
	out := Status{Dir: dir, Server: s.Server, Kubeconfig: s.Kubeconfig, KubeVersion: s.KubeVersion, BinDir: s.BinDir}
	if out.BinDir == "" {
		out.BinDir = DefaultBinDir()
	}
	for _, c := range s.Components {
		out.Components = append(out.Components, ComponentStatus{Name: c.Name, PID: c.PID, Running: c.alive(), Log: c.Log})
	}
	return out, nil
}

func (s *state) anyAlive() bool {
	for _, c := range s.Components {
		if c.alive() {
			return true
		}
	}
	return false
}

// waitHealthy polls url until it answers 200, failing at once with the log
// tail when the process exits.
func waitHealthy(ctx context.Context, p *proc, client *http.Client, url string) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	var last string
	for {
		resp, err := client.Get(url)
		if err == nil {
			body := make([]byte, 512)
			n, _ := resp.Body.Read(body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(body[:n])))
		} else {
			last = err.Error()
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited during start-up (%v); end of %s:\n%s", p.Name, p.waitErr, p.Log, LogTail(p.Log, 30))
		case <-ctx.Done():
			return fmt.Errorf("%s not healthy after %v (%s: %s); end of %s:\n%s", p.Name, startTimeout, url, last, p.Log, LogTail(p.Log, 30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitDefaultServiceAccount waits for the service-account controller to
// create default/default: proof that the controller-manager reaches the API
// server with working credentials, and what pod admission needs.
func (c *Cluster) waitDefaultServiceAccount(ctx context.Context, kcm *proc) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		_, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsNotFound(err) && ctx.Err() == nil {
			return fmt.Errorf("reading ServiceAccount default/default: %w", err)
		}
		select {
		case <-kcm.exited:
			return fmt.Errorf("kube-controller-manager exited (%v); end of %s:\n%s", kcm.waitErr, kcm.Log, LogTail(kcm.Log, 30))
		case <-ctx.Done():
			return fmt.Errorf("the controller-manager did not create ServiceAccount default/default within %v; end of %s:\n%s", startTimeout, kcm.Log, LogTail(kcm.Log, 30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func writeKubeconfig(path, server string, ca []byte, user keyPair, userName string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["shunt"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos[userName] = &clientcmdapi.AuthInfo{ClientCertificateData: user.cert, ClientKeyData: user.key}
	cfg.Contexts["shunt"] = &clientcmdapi.Context{Cluster: "shunt", AuthInfo: userName}
	cfg.CurrentContext = "shunt"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return os.Chmod(path, 0o600)
}

// freePort asks the kernel for a free loopback port. Another process could
// take it before the component binds it; the component then fails to start
// and says "address already in use" in the error.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// firstIP is the first usable address of a range: the API server gives it
// to the kubernetes Service.
func firstIP(n *net.IPNet) net.IP {
	ip := make(net.IP, len(n.IP))
	copy(ip, n.IP)
	ip[len(ip)-1]++
	return ip
}
