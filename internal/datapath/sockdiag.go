package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/netnsrun"
)

// The sock-diag fallback of DestroyUDPSockets (dpinfo.FallbackSockDiag),
// for kernels without the bpf_sock_destroy kfunc (before Linux 6.5), as
// Cilium does on such kernels: the connected UDP sockets of a namespace are
// listed over NETLINK_SOCK_DIAG, and each one the socket hooks translated
// to a gone backend is destroyed with SOCK_DESTROY, which aborts it as
// bpf_sock_destroy does (udp_abort with ECONNABORTED).
//
// Which sockets the hooks translated: the iterator asks the socket's own
// record (shunt_sock_svc), socket storage that user space can read only
// through a file descriptor of the socket. What user space can read is
// shunt_revnat, where the connect hook files every UDP socket it
// translates under its namespace's and its own cookie and the backend: a
// connected socket whose destination is a gone backend and that has such an
// entry was steered there by the hooks. sock_diag gives the socket's cookie
// (idiag_cookie), the namespace's is the agent's to read. shunt_revnat is an
// LRU map: a socket whose entry was evicted (more than 262144 UDP
// translations since it connected) is not found, and stays; it also holds
// an entry for a socket that sent to the service unconnected before it
// connected to the backend's address directly, which is then destroyed
// too.

// The wire layout of struct inet_diag_sockid (linux/inet_diag.h); ports
// and addresses are in network byte order.
type inetDiagSockID struct {
	SPort, DPort [2]byte
	Src, Dst     [16]byte
	If           uint32
	Cookie       [2]uint32
}

// struct inet_diag_req_v2
type inetDiagReqV2 struct {
	Family, Protocol, Ext, Pad uint8
	States                     uint32
	ID                         inetDiagSockID
}

// struct inet_diag_msg
type inetDiagMsg struct {
	Family, State, Timer, Retrans uint8
	ID                            inetDiagSockID
	Expires, RQueue, WQueue, UID  uint32
	Inode                         uint32
}

// tcpEstablished is TCP_ESTABLISHED, the state of a connected UDP socket
// (an unconnected one is in TCP_CLOSE).
const tcpEstablished = 1

// cookie is the socket's cookie (what bpf_get_socket_cookie gives).
func (id inetDiagSockID) cookie() uint64 { return uint64(id.Cookie[0]) | uint64(id.Cookie[1])<<32 }

// dst4 is the IPv4 destination: the address of an AF_INET socket, the
// v4-mapped one of an AF_INET6 socket; false for an IPv6 destination.
func (m inetDiagMsg) dst4() (netip.AddrPort, bool) {
	port := binary.BigEndian.Uint16(m.ID.DPort[:])
	switch m.Family {
	case unix.AF_INET:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.ID.Dst[:4])), port), true
	case unix.AF_INET6:
		if a := netip.AddrFrom16(m.ID.Dst); a.Is4In6() {
			return netip.AddrPortFrom(a.Unmap(), port), true
		}
	}
	return netip.AddrPort{}, false
}

// errSockDiagDestroyUnsupported is what a kernel built without
// CONFIG_INET_DIAG_DESTROY answers SOCK_DESTROY with.
var errSockDiagDestroyUnsupported = errors.New("destroying UDP sockets over sock_diag needs a kernel built with " +
	"CONFIG_INET_DIAG_DESTROY=y (and CONFIG_INET_UDP_DIAG), which this kernel lacks; " +
	"without it (and without bpf_sock_destroy, Linux 6.5+) connected UDP sockets keep sending to a deleted backend until the application reconnects")

// sockDiag is a NETLINK_SOCK_DIAG socket of the calling thread's network
// namespace.
type sockDiag struct {
	fd  int
	seq uint32
}

func openSockDiag() (*sockDiag, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("opening a NETLINK_SOCK_DIAG socket: %w", err)
	}
	return &sockDiag{fd: fd}, nil
}

func (s *sockDiag) close() error { return unix.Close(s.fd) }

// request sends one inet_diag_req_v2 with a netlink header of this type
// and flags, and returns its sequence number.
func (s *sockDiag) request(typ uint16, flags uint16, req inetDiagReqV2) (uint32, error) {
	s.seq++
	hdr := unix.NlMsghdr{
		Len: uint32(unix.SizeofNlMsghdr + binary.Size(req)), Type: typ,
		Flags: unix.NLM_F_REQUEST | flags, Seq: s.seq,
	}
	b, err := binary.Append(nil, binary.NativeEndian, hdr)
	if err == nil {
		b, err = binary.Append(b, binary.NativeEndian, req)
	}
	if err != nil {
		return 0, err
	}
	if err := unix.Sendto(s.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sending a sock_diag request: %w", err)
	}
	return s.seq, nil
}

// receive reads the answers to request seq, handing each message's
// payload to fn, until NLMSG_DONE (a dump) or NLMSG_ERROR (an
// acknowledgement: its error, nil for success).
func (s *sockDiag) receive(seq uint32, fn func(data []byte) error) error {
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(s.fd, buf, 0)
		if err != nil {
			return fmt.Errorf("reading sock_diag answers: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("decoding sock_diag answers: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return errors.New("a short sock_diag error message")
				}
				if errno := -int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
					return syscall.Errno(errno)
				}
				return nil
			}
			if err := fn(m.Data); err != nil {
				return err
			}
		}
	}
}

// connectedUDP lists the connected UDP sockets of the namespace, IPv4 and
// IPv6.
func (s *sockDiag) connectedUDP() ([]inetDiagMsg, error) {
	var out []inetDiagMsg
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		seq, err := s.request(unix.SOCK_DIAG_BY_FAMILY, unix.NLM_F_DUMP, inetDiagReqV2{
			Family: family, Protocol: unix.IPPROTO_UDP, States: 1 << tcpEstablished,
		})
		if err != nil {
			return nil, err
		}
		err = s.receive(seq, func(data []byte) error {
			var m inetDiagMsg
			if _, err := binary.Decode(data, binary.NativeEndian, &m); err != nil {
				return fmt.Errorf("decoding a sock_diag socket: %w", err)
			}
			out = append(out, m)
			return nil
		})
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("listing UDP sockets over sock_diag: the kernel has no UDP sock_diag (CONFIG_INET_UDP_DIAG, or its module udp_diag): %w", err)
		}
		if err != nil {
			return nil, fmt.Errorf("listing UDP sockets over sock_diag: %w", err)
		}
	}
	return out, nil
}

// destroy aborts the socket m names (by its addresses and cookie). It
// returns false, and no error, when the socket is gone already.
func (s *sockDiag) destroy(m inetDiagMsg) (bool, error) {
	seq, err := s.request(unix.SOCK_DESTROY, unix.NLM_F_ACK, inetDiagReqV2{
		Family: m.Family, Protocol: unix.IPPROTO_UDP, States: 1 << tcpEstablished, ID: m.ID,
	})
	if err != nil {
		return false, err
	}
	err = s.receive(seq, func([]byte) error { return nil })
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENOENT): // closed (or reconnected) since the dump
		return false, nil
	case errors.Is(err, unix.EOPNOTSUPP):
		return false, fmt.Errorf("%w: %w", errSockDiagDestroyUnsupported, err)
	}
	return false, err
}

// destroyUDPSocketsSockDiag is DestroyUDPSockets with the sock-diag
// fallback: in each namespace, every connected UDP socket whose
// destination is one of gone and that shunt_revnat says the hooks steered
// there is destroyed.
func (d *Datapath) destroyUDPSocketsSockDiag(netnsPaths []string, gone []sockdestroyGoneBackend) (destroyed int, err error) {
	goneSet := make(map[sockdestroyGoneBackend]bool, len(gone))
	for _, k := range gone {
		goneSet[k] = true
	}
	var errs []error
	for _, path := range netnsPaths {
		var n int
		err := netnsrun.Do(path, func() error {
			var err error
			n, err = d.destroyUDPSocketsHere(goneSet)
			return err
		})
		destroyed += n
		if errors.Is(err, netnsrun.ErrGone) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("network namespace %s: %w", netnsName(path), err))
			if errors.Is(err, errSockDiagDestroyUnsupported) {
				break // the same in every namespace
			}
		}
	}
	return destroyed, errors.Join(errs...)
}

// destroyUDPSocketsHere destroys, in the calling thread's namespace, the
// connected UDP sockets steered to a backend of gone.
func (d *Datapath) destroyUDPSocketsHere(gone map[sockdestroyGoneBackend]bool) (destroyed int, err error) {
	netns, err := currentNetnsCookie()
	if err != nil {
		return 0, err
	}
	s, err := openSockDiag()
	if err != nil {
		return 0, err
	}
	defer s.close()
	socks, err := s.connectedUDP()
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, m := range socks {
		dst, ok := m.dst4()
		if !ok || !gone[sockdestroyGoneBackend{Ip: be32(dst.Addr()), Port: be16(dst.Port()), Proto: protoUDP}] {
			continue
		}
		var rev sockaddrRevnatValue
		key := sockaddrRevnatKey{NetnsCookie: netns, SockCookie: m.ID.cookie(), BackendIp: be32(dst.Addr()), BackendPort: be16(dst.Port())}
		if err := d.sockAddr.ShuntRevnat.Lookup(key, &rev); err != nil {
			continue // not steered by the hooks (or its entry was evicted)
		}
		ok, err := s.destroy(m)
		if err != nil {
			errs = append(errs, fmt.Errorf("destroying UDP socket (cookie %d) to %s: %w", m.ID.cookie(), dst, err))
			if errors.Is(err, errSockDiagDestroyUnsupported) {
				break
			}
			continue
		}
		if ok {
			destroyed++
		}
	}
	return destroyed, errors.Join(errs...)
}
