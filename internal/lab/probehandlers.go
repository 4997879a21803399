package lab

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/shuntnet/shunt/internal/podexec"
)

// How the lab's kubelet runs one probe, as kubelet does: httpGet,
// tcpSocket and grpc from the node (the agent's network namespace, the
// node's) to the pod's address, exec inside the container.

// probeTarget is where a container's probes go.
type probeTarget struct {
	podIP string
	// exec: the container's namespace, cgroup, privileges and environment.
	exec podexec.Target
	env  []string
	dir  string
	// imageShim: the container runs from an image (rootfs.go) under this
	// shim; an exec runs in its file system (imageexec.go).
	imageShim int
}

// runnerOf returns the function that runs probe against the container.
func runnerOf(c corev1.Container, probe *corev1.Probe, t probeTarget) probeFunc {
	h := probe.ProbeHandler
	switch {
	case h.HTTPGet != nil:
		return httpProbe(c, h.HTTPGet, t.podIP)
	case h.TCPSocket != nil:
		return func(ctx context.Context) (bool, string) {
			port, err := portOf(c, h.TCPSocket.Port)
			if err != nil {
				return false, err.Error()
			}
			host := cmpOr(h.TCPSocket.Host, t.podIP)
			var d net.Dialer
			conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
			if err != nil {
				return false, err.Error()
			}
			conn.Close()
			return true, ""
		}
	case h.GRPC != nil:
		return grpcProbe(h.GRPC, t.podIP)
	case h.Exec != nil:
		return execProbe(h.Exec.Command, t)
	}
	return func(context.Context) (bool, string) { return false, "the probe names no handler" }
}

func cmpOr(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

// portOf resolves a probe's port: a number, or the name of one of the
// container's ports.
func portOf(c corev1.Container, p intstr.IntOrString) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("port %q: container %s has no port of that name", p.StrVal, c.Name)
}

// httpProbe succeeds on a status from 200 to 399, as kubelet's: it
// follows redirects on the same host, and counts one to another host a
// success; HTTPS is not verified; connections are not kept.
func httpProbe(c corev1.Container, g *corev1.HTTPGetAction, podIP string) probeFunc {
	client := &http.Client{
		Transport: &http.Transport{
			DisableKeepAlives: true, Proxy: nil,
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // as kubelet: probes do not verify
		},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 10 {
				return errors.New("stopped after 10 redirects")
			}
			if req.URL.Hostname() != via[0].URL.Hostname() {
				return http.ErrUseLastResponse
			}
			return nil
		},
	}
	return func(ctx context.Context) (bool, string) {
		port, err := portOf(c, g.Port)
		if err != nil {
			return false, err.Error()
		}
		scheme := strings.ToLower(string(g.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		path := g.Path
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		target := scheme + "://" + net.JoinHostPort(cmpOr(g.Host, podIP), strconv.Itoa(port)) + path
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
		if err != nil {
			return false, err.Error()
		}
		req.Header.Set("User-Agent", "kube-probe/shunt-lab")
		req.Header.Set("Accept", "*/*")
		for _, h := range g.HTTPHeaders {
			if strings.EqualFold(h.Name, "Host") {
				req.Host = h.Value
				continue
			}
			req.Header.Add(h.Name, h.Value)
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		if resp.StatusCode >= 200 && resp.StatusCode < 400 {
			return true, ""
		}
		return false, fmt.Sprintf("HTTP probe failed with statuscode: %d", resp.StatusCode)
	}
}

// grpcProbe asks the gRPC health service (grpc.health.v1) for the probe's
// service; SERVING succeeds.
func grpcProbe(g *corev1.GRPCAction, podIP string) probeFunc {
	return func(ctx context.Context) (bool, string) {
		conn, err := grpc.NewClient(net.JoinHostPort(podIP, strconv.Itoa(int(g.Port))),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return false, err.Error()
		}
		defer conn.Close()
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: cmpOr(ptrValue(g.Service), "")})
		if err != nil {
			return false, fmt.Sprintf("gRPC health check: %v", err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return false, "service unhealthy (responded with " + resp.GetStatus().String() + ")"
		}
		return true, ""
	}
}

func ptrValue[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// execProbe runs the command inside the container (its network namespace,
// cgroup, privileges, hidden directories and environment); exit 0
// succeeds, and so does nothing else, a timeout included.
func execProbe(command []string, t probeTarget) probeFunc {
	return func(ctx context.Context) (bool, string) {
		if len(command) == 0 {
			return false, "exec probe without a command"
		}
		cmd := exec.CommandContext(ctx, command[0], command[1:]...)
		cmd.Env, cmd.Dir = t.env, cmpOr(t.dir, "/")
		target := t.exec
		if t.imageShim != 0 {
			var err error
			if target, cmd.Path, err = imageExecTarget(t.exec, t.imageShim, command[0], t.env); err != nil {
				return false, err.Error()
			}
			cmd.Err = nil
		} else if lp, err := lookPath(command[0], t.env); err == nil {
			cmd.Path, cmd.Err = lp, nil
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := podexec.Start(target, cmd); err != nil {
			return false, err.Error()
		}
		err := cmd.Wait()
		if ctx.Err() != nil {
			return false, fmt.Sprintf("command %q timed out", command)
		}
		if err != nil {
			return false, fmt.Sprintf("command %q: %v: %s", command, err, strings.TrimSpace(out.String()))
		}
		return true, ""
	}
}

// lookPath finds a command on the container's PATH (not the agent's).
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	i := slices.IndexFunc(env, func(e string) bool { return strings.HasPrefix(e, "PATH=") })
	if i < 0 {
		return exec.LookPath(name)
	}
	for _, dir := range strings.Split(strings.TrimPrefix(env[i], "PATH="), ":") {
		p := dir + "/" + name
		if _, err := exec.LookPath(p); err == nil {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}
