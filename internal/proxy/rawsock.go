package proxy

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawSock reads and writes a connection's socket with raw system calls,
// waiting in Go's poller as the connection's own Read and Write do (and
// with their deadlines). A read or write on a non-blocking socket never
// blocks, so it needs none of what syscall.Syscall does around a call that
// might: in particular, that wrapper wakes the runtime's monitor thread
// (sysmon) whenever it sleeps because every P was idle, which at the mesh
// benchmark's load (each request arriving to an idle process) was a futex
// wake-up, a context switch and a few nanosleeps per request, about a fifth
// of the proxy's CPU (perf, BenchmarkProxyProcess).
type rawSock struct {
	rc      syscall.RawConn
	buf     []byte // of the Read or Write under way
	n       int
	err     error
	readFn  func(fd uintptr) bool // made once: a closure per call would be allocated
	writeFn func(fd uintptr) bool
}

// newRawSock returns c's socket for raw reads and writes, or c itself when
// it has no file descriptor (then c's own Read and Write serve).
func newRawSock(c net.Conn) io.ReadWriter {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	s := &rawSock{rc: rc}
	s.readFn = func(fd uintptr) bool {
		n, err := rawRead(fd, s.buf)
		if err == unix.EAGAIN {
			return false
		}
		s.n, s.err = n, err
		return true
	}
	s.writeFn = func(fd uintptr) bool {
		for s.n < len(s.buf) {
			n, err := rawWrite(fd, s.buf[s.n:])
			switch {
			case err == unix.EAGAIN:
				return false // the socket's buffer is full: wait until it is writable
			case err != nil:
				s.err = os.NewSyscallError("write", err)
				return true
			}
			s.n += n
		}
		return true
	}
	return s
}

func (s *rawSock) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.buf, s.n, s.err = p, 0, nil
	err := s.rc.Read(s.readFn)
	s.buf = nil
	if err != nil { // closed, or the read deadline
		return 0, err
	}
	return s.n, s.err
}

func (s *rawSock) Write(p []byte) (int, error) {
	s.buf, s.n, s.err = p, 0, nil
	err := s.rc.Write(s.writeFn)
	s.buf = nil
	if err == nil {
		err = s.err
	}
	return s.n, err
}

// rawRead reads into b: io.EOF when the peer closed, unix.EAGAIN when
// there is nothing to read yet.
func rawRead(fd uintptr, b []byte) (int, error) {
	for {
		n, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			return 0, unix.EAGAIN
		case e != 0:
			return 0, os.NewSyscallError("read", e)
		case n == 0:
			return 0, io.EOF
		}
		return int(n), nil
	}
}

func rawWrite(fd uintptr, b []byte) (int, error) {
	for {
		n, _, e := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}
