package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/shuntnet/shunt/internal/dpinfo"
	"github.com/shuntnet/shunt/internal/netnsrun"
)

// sockDestroyer holds the socket iterator of DestroyUDPSockets. It is loaded
// on first use, not by Open: loading costs tens of milliseconds (the
// kernel's BTF is read for the kfunc and CO-RE), and a kernel older than 6.5
// must still run everything else.
type sockDestroyer struct {
	mu      sync.Mutex // one run at a time: the gone-backend map is shared
	loaded  bool
	loadErr error // sticky: a kernel that lacks the feature will not grow it
	objs    sockdestroyObjects
	iter    *link.Iter
}

func (s *sockDestroyer) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.loaded || s.loadErr != nil {
		return nil
	}
	s.loaded = false
	return errors.Join(s.iter.Close(), s.objs.Close())
}

// goneBackends is the iterator's map of gone backends, nil until it is
// loaded.
func (s *sockDestroyer) goneBackends() *ebpf.Map {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.loaded || s.loadErr != nil {
		return nil
	}
	return s.objs.ShuntGoneBackends
}

// errSockDestroyUnsupported names what an older kernel lacks.
var errSockDestroyUnsupported = errors.New("destroying sockets of deleted backends needs the " +
	"iter/udp socket iterator and the bpf_sock_destroy kfunc (Linux 6.5+), or the sock-diag kernel fallback (shuntd --kernel-fallbacks sock-diag)")

// load loads the iterator with the connect hooks' shunt_sock_svc map
// (bpf/lib/sock_svc.h), so it sees which sockets they translated and to
// which backend.
func (s *sockDestroyer) load(sockSvc *ebpf.Map, pinDir string) error {
	if s.loaded {
		return s.loadErr
	}
	s.loaded = true
	spec, err := loadSockdestroy()
	if err != nil {
		s.loadErr = err
		return err
	}
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{"shunt_sock_svc": sockSvc}}
	if err := spec.LoadAndAssign(&s.objs, opts); err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			s.loadErr = fmt.Errorf("%w: %w", errSockDestroyUnsupported, err)
		} else {
			s.loadErr = explainLoadError(err, pinDir)
		}
		return s.loadErr
	}
	// One link for every run: each Open of it starts a new iteration in
	// the network namespace of the opening thread.
	s.iter, err = link.AttachIter(link.IterOptions{Program: s.objs.ShuntDestroyUdp})
	if err != nil {
		s.objs.Close()
		s.loadErr = fmt.Errorf("%w: attaching the iterator: %w", errSockDestroyUnsupported, err)
		return s.loadErr
	}
	return nil
}

// DestroyUDPSockets destroys the connected UDP sockets that the socket-layer
// load balancer translated to one of the gone backends, in each network
// namespace of netnsPaths ("" is the agent's own namespace), and returns how
// many it destroyed.
//
// A connected UDP socket is translated once, at connect(), and keeps sending
// to its backend for as long as it lives: when the backend's pod is deleted
// (a DNS pod restarted), the socket blackholes every query. Destroying it
// disconnects it with ECONNABORTED as its pending error: the application's
// next receive fails with ECONNABORTED (a send without an address with
// EDESTADDRREQ), and the new socket it opens is translated to a live backend. Sockets connected
// to the backend address directly (not through a service), unconnected
// sockets and sockets of other backends are left alone.
//
// The kernel's socket iterator only walks the namespace of the thread that
// starts it, so each namespace is entered on a locked thread. A namespace
// path that no longer exists (the pod is gone, and its sockets with it) is
// skipped. Needs Linux 6.5+ (bpf_sock_destroy); with the sock-diag fallback
// (older kernels) the sockets are found and destroyed over sock_diag
// instead (sockdiag.go), which needs CONFIG_INET_DIAG_DESTROY: without it
// the error says so and nothing else changes.
func (d *Datapath) DestroyUDPSockets(netnsPaths []string, gone []netip.AddrPort) (destroyed int, err error) {
	keys := goneBackendKeys(gone)
	if len(keys) == 0 || len(netnsPaths) == 0 {
		return 0, nil
	}
	if d.cfg.Fallbacks.Has(dpinfo.FallbackSockDiag) {
		return d.destroyUDPSocketsSockDiag(netnsPaths, keys)
	}
	s := &d.destroyer
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.load(d.sockAddr.ShuntSockSvc, d.cfg.PinDir); err != nil {
		return 0, err
	}
	batch := int(s.objs.ShuntGoneBackends.MaxEntries())
	var errs []error
	for len(keys) > 0 {
		n := min(batch, len(keys))
		count, err := s.run(netnsPaths, keys[:n])
		destroyed += count
		if err != nil {
			errs = append(errs, err)
		}
		keys = keys[n:]
	}
	return destroyed, errors.Join(errs...)
}

// goneBackendKeys turns addresses into map keys, dropping duplicates and
// what no IPv4 service can have translated to.
func goneBackendKeys(gone []netip.AddrPort) []sockdestroyGoneBackend {
	seen := make(map[sockdestroyGoneBackend]bool, len(gone))
	var keys []sockdestroyGoneBackend
	for _, ap := range gone {
		ip := ap.Addr().Unmap()
		if !ip.Is4() {
			continue
		}
		k := sockdestroyGoneBackend{Ip: be32(ip), Port: be16(ap.Port()), Proto: protoUDP}
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	return keys
}

const (
	protoTCP = 6
	protoUDP = 17
)

// run fills the gone-backend map with keys, iterates every namespace and
// empties the map again, so no stale entry can destroy a socket of a later
// backend at the same address.
func (s *sockDestroyer) run(netnsPaths []string, keys []sockdestroyGoneBackend) (destroyed int, err error) {
	m := s.objs.ShuntGoneBackends
	defer func() {
		for _, k := range keys {
			if derr := m.Delete(k); derr != nil && !errors.Is(derr, ebpf.ErrKeyNotExist) {
				err = errors.Join(err, fmt.Errorf("emptying shunt_gone_backends: %w", derr))
			}
		}
	}()
	for _, k := range keys {
		if err := m.Put(k, uint8(1)); err != nil {
			return 0, fmt.Errorf("writing shunt_gone_backends: %w", err)
		}
	}
	var errs []error
	for _, path := range netnsPaths {
		var out []byte
		err := netnsrun.Do(path, func() error {
			var err error
			out, err = s.iterate()
			return err
		})
		if errors.Is(err, netnsrun.ErrGone) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
		}
		n, rerr := destroyResults(out, path)
		destroyed += n
		if rerr != nil {
			errs = append(errs, rerr)
		}
	}
	return destroyed, errors.Join(errs...)
}

// iterate runs the iterator once, in the calling thread's namespace, and
// returns its output: one destroy_result per socket it tried to destroy.
func (s *sockDestroyer) iterate() ([]byte, error) {
	r, err := s.iter.Open()
	if err != nil {
		return nil, fmt.Errorf("starting the UDP socket iterator: %w", err)
	}
	defer r.Close()
	out, err := io.ReadAll(r)
	if err != nil {
		return out, fmt.Errorf("reading the UDP socket iterator: %w", err)
	}
	return out, nil
}

// destroyResults counts the sockets destroyed in out and reports the ones
// the kernel refused to destroy.
func destroyResults(out []byte, netnsPath string) (destroyed int, err error) {
	var errs []error
	for len(out) > 0 {
		var r sockdestroyDestroyResult
		n, err := binary.Decode(out, binary.NativeEndian, &r)
		if err != nil {
			errs = append(errs, fmt.Errorf("decoding the UDP socket iterator's output in network namespace %s: %w",
				netnsName(netnsPath), err))
			break
		}
		out = out[n:]
		if r.Err == 0 {
			destroyed++
			continue
		}
		errs = append(errs, fmt.Errorf("destroying UDP socket (cookie %d) in network namespace %s: %w",
			r.Cookie, netnsName(netnsPath), syscall.Errno(-r.Err)))
	}
	return destroyed, errors.Join(errs...)
}

func netnsName(path string) string {
	if path == "" {
		return "(the agent's own)"
	}
	return path
}
