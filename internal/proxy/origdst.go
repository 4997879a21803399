package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// OriginalDst asks the kernel where an accepted connection was headed. The
// socket hooks sent the client's connect to the proxy and answer
// getsockopt(SOL_IP, SO_ORIGINAL_DST) on the accepted socket with the
// address the client dialled, as a sockaddr_in (netfilter's REDIRECT
// answers the same call the same way).
func OriginalDst(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("original destination: %T is not a socket", c)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	var sa unix.RawSockaddrInet4
	var errno syscall.Errno
	err = raw.Control(func(fd uintptr) {
		size := uint32(unsafe.Sizeof(sa))
		_, _, errno = unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_IP, unix.SO_ORIGINAL_DST,
			uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&size)), 0)
	})
	switch {
	case err != nil:
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	case errno != 0:
		return netip.AddrPort{}, fmt.Errorf("getsockopt(SOL_IP, SO_ORIGINAL_DST): %w (was the connection redirected by the socket hooks, and does the proxy run in the cgroup where the getsockopt hook is attached?)", errno)
	case sa.Family != unix.AF_INET:
		return netip.AddrPort{}, errors.New("getsockopt(SOL_IP, SO_ORIGINAL_DST) answered no IPv4 address")
	}
	port := (*[2]byte)(unsafe.Pointer(&sa.Port)) // network byte order
	return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(port[0])<<8|uint16(port[1])), nil
}
