package proxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// The tc programs give the proxy the connections of clients no socket hook
// of this node sees (another node's pods, clients outside through a
// NodePort) that reach a local pod's port with HTTP rules: bpf_sk_assign to
// this transparent listener (bpf/lib/steer.h). The packets keep their
// addresses, so an accepted socket's local address is the original
// destination (no SO_ORIGINAL_DST), its peer the client, whose identity
// the configured endpoints give by address as for any client; its replies
// leave from the pod's address, which IP_TRANSPARENT allows.

// listenTransparent binds the transparent listener, with SO_REUSEPORT as
// the other listener (a new proxy process takes over the address).
func listenTransparent(addr netip.AddrPort) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); serr != nil {
				return
			}
			if err := unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1); err != nil {
				serr = fmt.Errorf("IP_TRANSPARENT (the proxy needs CAP_NET_ADMIN): %w", err)
			}
		}); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp4", addr.String())
	if err != nil {
		return nil, fmt.Errorf("listening for steered connections on %s: %w", addr, err)
	}
	return ln, nil
}

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
