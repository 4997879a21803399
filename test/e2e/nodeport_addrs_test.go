package e2e

import "testing"

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
		l.probe("", "connected", "--tcp", l.status().NodeIP+":31918")
	})
	t.Run("127.0.0.0/8", func(t *testing.T) {
		l := newLabWith(t, []string{"--mode", "redirect-peer", "--nodeport-addresses", "127.0.0.0/8"}, manifest)
		l.probe("", "connected", "--tcp", "127.0.0.1:31917")
		l.probe("", "refused", "--tcp", l.status().NodeIP+":31917")
		l.probe("", "connected", "--tcp", "127.0.0.1:31918")
		l.probe("", "refused", "--tcp", l.status().NodeIP+":31918")
		// A pod's 127.0.0.1 is its own: nothing listens on its 31917.
		l.probe("web", "refused", "--tcp", "127.0.0.1:31917")
	})
}
