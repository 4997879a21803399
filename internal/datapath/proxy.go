package datapath

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// L7 redirection (bpf/sock_addr.c, bpf/sock_ops.c, bpf/sockopt.c,
// bpf/lib/proxy.h): connects to chosen destinations go to a proxy, which
// learns the original destination through getsockopt(SOL_IP,
// SO_ORIGINAL_DST); its upstream sockets carry a mark
// that says "proxy" and which client identity they act for.

// ProxyMark is the SO_MARK layout of proxy upstream sockets: Magic under
// Mask marks them, the bits outside Mask carry the client's identity.
type ProxyMark struct {
	Magic uint32
	Mask  uint32
}

func (m ProxyMark) check() error {
	if m.Magic&^m.Mask != 0 {
		return fmt.Errorf("proxy mark %#x has bits outside its mask %#x: the identity would be garbled", m.Magic, m.Mask)
	}
	if m.Mask != 0 && m.Magic == 0 {
		return fmt.Errorf("proxy mark mask %#x with a zero magic would take every unmarked socket for the proxy", m.Mask)
	}
	return nil
}

// L7Redirect sends TCP connects to Dest to Proxy.
type L7Redirect struct {
	Dest  netip.AddrPort
	Proxy netip.AddrPort
}

// SyncL7Redirects makes shunt_l7_redirect hold exactly these entries: new
// and changed ones first, stale ones after.
func (d *Datapath) SyncL7Redirects(want []L7Redirect) error {
	m := d.sockAddr.ShuntL7Redirect
	keys := make(map[sockaddrL7RedirectKey]sockaddrL7RedirectValue, len(want))
	for _, r := range want {
		if !r.Dest.Addr().Is4() || !r.Proxy.Addr().Is4() {
			return fmt.Errorf("L7 redirect %s -> %s: only IPv4 is supported", r.Dest, r.Proxy)
		}
		keys[sockaddrL7RedirectKey{Ip: be32(r.Dest.Addr()), Port: be16(r.Dest.Port()), Proto: protoTCP}] =
			sockaddrL7RedirectValue{ProxyIp: be32(r.Proxy.Addr()), ProxyPort: be16(r.Proxy.Port())}
	}
	if err := d.checkFits("shunt_l7_redirect", len(keys)); err != nil {
		return err
	}
	d.drift.l7 = nil // until this sync succeeds: a failed one is retried
	wanted := maps.Clone(keys)
	var stale []sockaddrL7RedirectKey
	var k sockaddrL7RedirectKey
	var v sockaddrL7RedirectValue
	it := m.Iterate()
	for it.Next(&k, &v) {
		if nv, ok := keys[k]; !ok {
			stale = append(stale, k)
		} else if nv == v {
			delete(keys, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading shunt_l7_redirect: %w", err)
	}
	for k, v := range keys {
		if err := m.Put(k, v); err != nil {
			return fmt.Errorf("writing shunt_l7_redirect: %w", err)
		}
	}
	var errs []error
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("deleting from shunt_l7_redirect: %w", err))
		}
	}
	if len(errs) == 0 {
		d.drift.l7 = wanted
	}
	return errors.Join(errs...)
}

// L7Redirects reads shunt_l7_redirect back, sorted by destination.
func (d *Datapath) L7Redirects() ([]L7Redirect, error) {
	var out []L7Redirect
	var k sockaddrL7RedirectKey
	var v sockaddrL7RedirectValue
	it := d.sockAddr.ShuntL7Redirect.Iterate()
	for it.Next(&k, &v) {
		out = append(out, L7Redirect{
			Dest:  netip.AddrPortFrom(fromBe32(k.Ip), fromBe16(k.Port)),
			Proxy: netip.AddrPortFrom(fromBe32(v.ProxyIp), fromBe16(v.ProxyPort)),
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading shunt_l7_redirect: %w", err)
	}
	slices.SortFunc(out, func(a, b L7Redirect) int { return a.Dest.Compare(b.Dest) })
	return out, nil
}

// AttachProxy attaches the SO_ORIGINAL_DST answer to the cgroup a proxy runs
// in. Only there: the program runs on every getsockopt of the cgroup (Go
// asks SO_ERROR after each connect). name tells the pinned links apart
// ("node" for the node proxy).
func (d *Datapath) AttachProxy(name, cgroupPath string) error {
	always := func(link.Link) bool { return true }
	attach := func() (link.Link, error) {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: ebpf.AttachCGroupGetsockopt, Program: d.sockopt.ShuntGetsockopt})
		if err != nil {
			return nil, fmt.Errorf("attaching getsockopt (SO_ORIGINAL_DST for the proxy) to cgroup %s: %w", cgroupPath, err)
		}
		return l, nil
	}
	return attachPinned(d.proxyLinkPin(name), d.sockopt.ShuntGetsockopt, always, attach)
}

// DetachProxy removes what AttachProxy attached (a no-op when nothing is).
func (d *Datapath) DetachProxy(name string) error { return unpinLink(d.proxyLinkPin(name)) }

func (d *Datapath) proxyLinkPin(name string) string {
	return filepath.Join(d.cfg.PinDir, "links", "proxy-getsockopt-"+name)
}
