package e2e

import (
	"strings"
	"testing"
)

// healthCheckAnswers checks that the node's health check port 31918
// answers at addr with 200 (the Service's endpoint is on the node).
func healthCheckAnswers(t *testing.T, l *lab, addr string) {
	t.Helper()
	eventually(t, "health check port at "+addr, "200", func() (string, string) {
		out, code := l.shunt("lab", "http-get", "--timeout", "2s", "http://"+addr+":31918/")
		if code != 0 {
			return "", out
		}
		status, _, _ := strings.Cut(out, "\n")
		return status, out
	})
}

// TestNodePortAddressesLab: by default a NodePort is served on the node's
// address and not at 127.0.0.1 (nothing listens on 127.0.0.1:31917, so
// the node's connect is refused); with --nodeport-addresses 127.0.0.0/8,
// as kube-proxy's flag, the node's own processes reach it at 127.0.0.1
// and the node's address (not selected) no longer serves it. The
// healthCheckNodePort of a Local Service (31918) listens likewise, as
// kube-proxy's: on every address by default, at 127.0.0.1 only with the
// flag.
func TestNodePortAddressesLab(t *testing.T) {
	const manifest = "testdata/nodeport-addrs.yaml"
	t.Run("default", func(t *testing.T) {
		l := newLabWith(t, []string{"--mode", "redirect-peer"}, manifest)
		l.probe("", "connected", "--tcp", l.status().NodeIP+":31917")
		l.probe("", "refused", "--tcp", "127.0.0.1:31917")
		healthCheckAnswers(t, l, l.status().NodeIP)
	})
	t.Run("127.0.0.0/8", func(t *testing.T) {
		l := newLabWith(t, []string{"--mode", "redirect-peer", "--nodeport-addresses", "127.0.0.0/8"}, manifest)
		l.probe("", "connected", "--tcp", "127.0.0.1:31917")
		l.probe("", "refused", "--tcp", l.status().NodeIP+":31917")
		healthCheckAnswers(t, l, "127.0.0.1")
		l.probe("", "refused", "--tcp", l.status().NodeIP+":31918")
		// A pod's 127.0.0.1 is its own: nothing listens on its 31917.
		l.probe("web", "refused", "--tcp", "127.0.0.1:31917")
	})
}
