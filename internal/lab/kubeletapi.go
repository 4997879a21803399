package lab

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"time"

	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"

	"github.com/shuntnet/shunt/internal/netnsrun"
	"github.com/shuntnet/shunt/internal/podexec"
	"github.com/shuntnet/shunt/internal/podnet"
)

// The kubelet API of a lab node whose pods come from a Kubernetes API
// server: what the API server proxies `kubectl exec`, `attach`, `logs` and
// `port-forward` to (pods/exec, pods/attach, pods/log, pods/portforward),
// on the node's kubelet port over TLS, as a kubelet serves them. The
// streams are the upstream streaming library's (k8s.io/cri-streaming, the
// code kubelet and the CRI runtimes serve them with); an exec enters the
// container as `shunt lab exec` does (joinContainer).
//
// Who may call it: a client whose certificate the cluster's CA signed
// (ClientCA: the API server's --kubelet-client-certificate is) and whom
// the API server authorizes (a SubjectAccessReview of nodes/proxy, as
// kubelet's webhook authorization: kubeletauthz.go).
//
// Its serving certificate is the cluster CA's once a certificate request
// is signed (kubeletcert.go), its own self-signed one until then.

// KubeletPort is the kubelet API's port on the node's address, the
// kubelet's --port.
const KubeletPort = 10250

// kubeletAPIGroup is the group a client must be in.
const kubeletAPIGroup = "system:masters"

// streamIdleTimeout and streamCreationTimeout are the kubelet's defaults
// (--streaming-connection-idle-timeout; the streaming library's).
const (
	streamIdleTimeout     = 4 * time.Hour
	streamCreationTimeout = remotecommand.DefaultStreamCreationTimeout
)

// KubeletAPI is the running kubelet API of a node.
type KubeletAPI struct {
	k     *APIKubelet
	addr  netip.AddrPort
	srv   *http.Server
	authz kubeletAuthorizer // kubeletauthz.go
}

// ServeKubeletAPI serves the kubelet API on addr (the node's InternalIP:
// its underlay address, else its address on the pod network; port 0: any
// free one) until ctx ends, trusting clients signed by clientCA (PEM),
// and publishes its port in the Node's status (daemonEndpoints; addr as
// InternalIP on a Node that has none) with the node's heartbeat. Call it
// before Run.
func (k *APIKubelet) ServeKubeletAPI(ctx context.Context, addr netip.Addr, port int, clientCA []byte) (*KubeletAPI, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(clientCA) {
		return nil, errors.New("kubelet API: the API server's kubeconfig names no CA certificate to check its client certificate with (certificate-authority-data)")
	}
	cert, err := selfSignedServing(k.cfg.NodeName, addr)
	if err != nil {
		return nil, err
	}
	serving := &servingCert{}
	serving.set(cert)
	ln, err := net.Listen("tcp", netip.AddrPortFrom(addr, uint16(port)).String())
	if err != nil {
		return nil, fmt.Errorf("kubelet API: listening on the node's address: %w (is another kubelet on this address?)", err)
	}
	api := &KubeletAPI{k: k, addr: ln.Addr().(*net.TCPAddr).AddrPort(), authz: mastersOnly{}}
	if kp, ok := k.api.(*kubePods); ok {
		api.authz = newReviewAuthorizer(k.cfg.NodeName, kp.api.SubjectAccessReview, k.cfg.Log)
		go k.caServingCert(ctx, kp, addr, serving)
	}
	api.srv = &http.Server{
		Handler:           api.routes(),
		ReadHeaderTimeout: 30 * time.Second,
		TLSConfig: &tls.Config{
			GetCertificate: serving.get,
			ClientAuth:     tls.RequireAndVerifyClientCert,
			ClientCAs:      pool,
			MinVersion:     tls.VersionTLS12,
		},
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	go api.srv.ServeTLS(ln, "", "")
	go func() {
		<-ctx.Done()
		api.srv.Close()
	}()
	if kp, ok := k.api.(*kubePods); ok {
		kp.heartbeat.kubeletEndpoint(addr.String(), int32(api.addr.Port()))
	}
	k.cfg.Log.Info("kubelet API serving", "addr", api.addr.String())
	return api, nil
}

// Addr is where the kubelet API listens.
func (a *KubeletAPI) Addr() netip.AddrPort { return a.addr }

func (a *KubeletAPI) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	for _, p := range []string{"/exec/{ns}/{pod}/{container}", "/exec/{ns}/{pod}/{uid}/{container}"} {
		mux.HandleFunc("GET "+p, a.exec)
		mux.HandleFunc("POST "+p, a.exec)
	}
	for _, p := range []string{"/attach/{ns}/{pod}/{container}", "/attach/{ns}/{pod}/{uid}/{container}"} {
		mux.HandleFunc("GET "+p, a.attach)
		mux.HandleFunc("POST "+p, a.attach)
	}
	for _, p := range []string{"/portForward/{ns}/{pod}", "/portForward/{ns}/{pod}/{uid}"} {
		mux.HandleFunc("GET "+p, a.portForward)
		mux.HandleFunc("POST "+p, a.portForward)
	}
	mux.HandleFunc("GET /containerLogs/{ns}/{pod}/{container}", a.containerLogs)
	return authorized(a.authz, a.k.cfg.Log, mux)
}

// record is a copy of the pod's record, checked against the uid the
// request names (if any).
func (a *KubeletAPI) record(r *http.Request) (*PodRecord, int, error) {
	ns, name, uid := r.PathValue("ns"), r.PathValue("pod"), r.PathValue("uid")
	a.k.mu.Lock()
	defer a.k.mu.Unlock()
	rec := a.k.kubelet.pods[ns+"/"+name]
	if rec == nil || (uid != "" && rec.UID != "" && uid != rec.UID) {
		return nil, http.StatusNotFound, fmt.Errorf("pod %s/%s not found on node %s", ns, name, a.k.cfg.NodeName)
	}
	c := *rec
	c.Containers = slices.Clone(rec.Containers)
	return &c, 0, nil
}

// streamPod is the pod a streaming request (exec, attach, port-forward)
// is for; nil when the request is answered already with why not (its
// options, optsErr, are wrong; there is no such pod).
func (a *KubeletAPI) streamPod(w http.ResponseWriter, r *http.Request, optsErr error) *PodRecord {
	if optsErr != nil {
		http.Error(w, optsErr.Error(), http.StatusBadRequest)
		return nil
	}
	rec, code, err := a.record(r)
	if err != nil {
		http.Error(w, err.Error(), code)
		return nil
	}
	return rec
}

func (a *KubeletAPI) exec(w http.ResponseWriter, r *http.Request) {
	opts, err := remotecommand.NewOptions(r)
	cmd := r.URL.Query()["command"]
	if err == nil && len(cmd) == 0 {
		err = errors.New("no command given (query parameter command)")
	}
	rec := a.streamPod(w, r, err)
	if rec == nil {
		return
	}
	remotecommand.ServeExec(w, r, containerExec{rec: rec, cgroupRoot: a.k.cfg.CgroupRoot}, rec.key(), rec.UID, r.PathValue("container"), cmd, opts,
		streamIdleTimeout, streamCreationTimeout, remotecommand.SupportedStreamingProtocols)
}

// containerExec runs a command in one of a pod's containers for the
// streaming library.
type containerExec struct {
	rec        *PodRecord
	cgroupRoot string
}

func (e containerExec) ExecInContainer(ctx context.Context, _, _, container string, argv []string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize, _ time.Duration) error {
	j, err := joinContainer(e.rec, container, e.cgroupRoot)
	if err != nil {
		return err
	}
	cmd, err := j.Command(argv)
	if err != nil {
		return err
	}
	var term *terminal
	if tty {
		if term, err = newTerminal(cmd, resize); err != nil {
			return err
		}
		defer term.close()
	} else {
		if in != nil {
			cmd.Stdin = in
		}
		if out != nil {
			cmd.Stdout = out
		}
		if errOut != nil {
			cmd.Stderr = errOut
		}
	}
	// A client that keeps its stdin open after the command ended must not
	// hold the exec open.
	cmd.WaitDelay = time.Second
	if err := podexec.Start(j.Target, cmd); err != nil {
		return err
	}
	done := make(chan struct{})
	defer close(done)
	if term != nil {
		term.started(in, out)
		defer term.wait()
	}
	go func() {
		select {
		case <-ctx.Done(): // the client went away: so does its command
			cmd.Process.Kill()
		case <-done:
		}
	}()
	err = cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.Exited() {
		return utilexec.CodeExitError{Err: err, Code: ee.ExitCode()}
	}
	return err
}

func (a *KubeletAPI) attach(w http.ResponseWriter, r *http.Request) {
	opts, err := remotecommand.NewOptions(r)
	rec := a.streamPod(w, r, err)
	if rec == nil {
		return
	}
	remotecommand.ServeAttach(w, r, containerAttach{rec: rec}, rec.key(), rec.UID, r.PathValue("container"), opts,
		streamIdleTimeout, streamCreationTimeout, remotecommand.SupportedStreamingProtocols)
}

// containerAttach streams a container's output from now on, as an attach
// to a container without stdin (the lab gives containers none) does.
type containerAttach struct{ rec *PodRecord }

func (a containerAttach) AttachContainer(ctx context.Context, _, _, container string, _ io.Reader, out, errOut io.WriteCloser, tty bool, _ <-chan remotecommand.TerminalSize) error {
	if tty {
		return errors.New("the lab's containers have no terminal: attach without -t")
	}
	c, err := a.rec.container(container)
	if err != nil {
		return err
	}
	if out == nil {
		<-ctx.Done()
		return nil
	}
	return followLog(ctx, c, c.LogFile, logOptions{follow: true, fromEnd: true}, out, errOut)
}

func (a *KubeletAPI) portForward(w http.ResponseWriter, r *http.Request) {
	opts, err := portforward.NewV4Options(r)
	rec := a.streamPod(w, r, err)
	if rec == nil {
		return
	}
	portforward.ServePortForward(w, r, podPortForward{rec: rec}, rec.key(), rec.UID, opts,
		streamIdleTimeout, streamCreationTimeout, portforward.SupportedProtocols)
}

// podPortForward connects to a port on the pod's loopback, in its network
// namespace, as containerd does.
type podPortForward struct{ rec *PodRecord }

func (p podPortForward) PortForward(ctx context.Context, _, _ string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	var conn net.Conn
	// The socket is made in the pod's namespace and stays there.
	err := netnsrun.Do(podnet.NetnsPath(p.rec.Netns), func() error {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, "tcp4", "127.0.0.1:"+strconv.Itoa(int(port)))
		return err
	})
	if err != nil {
		return fmt.Errorf("pod %s: connecting to port %d: %w", p.rec.key(), port, err)
	}
	defer conn.Close()
	errc := make(chan error, 2)
	go func() { _, err := io.Copy(conn, stream); conn.(*net.TCPConn).CloseWrite(); errc <- err }()
	go func() { _, err := io.Copy(stream, conn); errc <- err }()
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	return err
}

// caServingCert replaces the self-signed serving certificate with one of
// the cluster's CA once signed; it keeps its own when none comes.
func (k *APIKubelet) caServingCert(ctx context.Context, kp *kubePods, addr netip.Addr, serving *servingCert) {
	ctx, cancel := context.WithTimeout(ctx, servingCertWait)
	defer cancel()
	cert, err := requestServingCert(ctx, kp.api, k.cfg.NodeName, addr, time.Second, func(err error) {
		if err != nil {
			k.cfg.Log.Info("kubelet API: the kubelet may not approve its serving certificate's request; waiting for an approver (kubectl certificate approve)", "err", err)
		}
	})
	if err != nil {
		if !errors.Is(ctx.Err(), context.Canceled) { // not the kubelet stopping
			k.cfg.Log.Warn("kubelet API: no serving certificate of the cluster's CA; serving its own, self-signed (an API server with --kubelet-certificate-authority refuses it)", "err", err)
		}
		return
	}
	serving.set(cert)
	k.cfg.Log.Info("kubelet API: serving a certificate of the cluster's CA", "subject", cert.Leaf.Subject.String(), "notAfter", cert.Leaf.NotAfter)
}

// selfSignedServing is a serving certificate for the node's address.
func selfSignedServing(node string, ip netip.Addr) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: node + "@" + strconv.FormatInt(time.Now().Unix(), 10)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{ip.AsSlice()},
		DNSNames:     []string{node},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("kubelet API: signing its serving certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// terminal is the pseudo-terminal of an exec with a tty (kubectl exec
// -t): the command's stdin, stdout and stderr, and its controlling
// terminal; the client's input and output go through its controlling
// side, its window size too.
type terminal struct {
	control, term *os.File
	output        chan struct{} // closed when all the output is copied
}

func newTerminal(cmd *exec.Cmd, resize <-chan remotecommand.TerminalSize) (*terminal, error) {
	control, term, err := podexec.OpenPTY()
	if err != nil {
		return nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = term, term, term
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	go func() {
		for size := range resize {
			podexec.Resize(control, size.Width, size.Height)
		}
	}()
	return &terminal{control: control, term: term, output: make(chan struct{})}, nil
}

// started copies the client's input in and the terminal's output out once
// the command runs (and holds the terminal itself).
func (t *terminal) started(in io.Reader, out io.Writer) {
	t.term.Close()
	if in != nil {
		go io.Copy(t.control, in)
	}
	go func() {
		defer close(t.output)
		if out == nil {
			out = io.Discard
		}
		// Reading ends (EIO) once the command and its children closed the
		// terminal and their output is read.
		io.Copy(out, t.control)
	}()
}

// wait returns once the output is copied, or soon after: a background
// child of the command may hold the terminal open.
func (t *terminal) wait() {
	select {
	case <-t.output:
	case <-time.After(time.Second):
	}
}

func (t *terminal) close() {
	t.term.Close()
	t.control.Close()
}
