package proxy

import "net"

// The tc programs give the proxy the connections of clients no socket hook
// of this node sees (another node's pods, clients outside through a
// NodePort) that reach a local pod's port with HTTP rules: bpf_sk_assign to
// this transparent listener (bpf/lib/steer.h). The packets keep their
// addresses, so an accepted socket's local address is the original
// destination (no SO_ORIGINAL_DST), its peer the client, whose identity
// the configured endpoints give by address as for any client; its replies
// leave from the pod's address, which IP_TRANSPARENT allows.

// swapSteerListener serves ln (when not nil) as the transparent listener
// in place of the previous one, or closes the previous one when t has
// none; the caller holds mu. Accepted connections stay.
func (p *Proxy) swapSteerListener(t *table, ln net.Listener) {
	old := p.steerLn
	switch {
	case ln != nil:
		p.steerLn = ln
		go p.serveListener(&listener{Listener: ln, p: p, transparent: true})
	case !t.steer.IsValid():
		p.steerLn = nil
	default:
		return // unchanged
	}
	if old != nil {
		old.Close()
	}
}
