// Package delayline gives a benchmark's link a fixed one-way latency
// without netem: this project's kernel has no sch_netem (nor fq, etf or
// tbf, which could hold packets to a departure time), and a machine
// without link latency cannot show what a hop fewer saves (issue 27: DSR
// against SNAT). A Line joins two interfaces of one network namespace, as
// a wire would: every frame received on one is sent out of the other a
// fixed delay after it arrived, in order, both ways.
//
// Frames are read and written with AF_PACKET sockets (PACKET_VNET_HDR, so
// a GSO frame crosses whole and keeps its offload state, as a tap device
// passes it; PACKET_IGNORE_OUTGOING, so a socket does not read back what
// the other direction wrote). Each direction is one thread, locked and
// blocking in the kernel: it reads a frame with the kernel's time of its
// arrival (SO_TIMESTAMPNS), sleeps with clock_nanosleep to that time plus
// the delay (timer slack 1 µs: Go's own timers wake no finer than a
// millisecond on an idle process), and writes it. Frames that arrive
// meanwhile wait in the socket's queue; one that finds the queue full is
// dropped by the kernel and counted, as a router's full queue drops it.
//
// What it costs: two system calls and up to two wake-ups of the thread
// per frame, tens of microseconds on a small VM, which a real link does
// not take from the hosts. Stats and the caller's notes should say so;
// the delay should be large against it.
package delayline

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/shuntnet/shunt/internal/netnsrun"
)

// frameMax is the largest frame with its virtio-net header: a GSO frame
// of 64 KiB and its headers.
const frameMax = 10 + 65536 + 256

// Line is a running delay line between two interfaces.
type Line struct {
	delay time.Duration
	fds   [2]int
	stop  atomic.Bool
	wg    sync.WaitGroup
	// Per direction (0: a to b, 1: b to a).
	passed, dropped [2]atomic.Uint64
}

// Start joins interfaces a and b of the network namespace at nsPath
// ("" is this process's) with a one-way delay. Neither may be a bridge
// port or carry addresses the namespace answers on: the line is their
// only way through.
func Start(nsPath, a, b string, delay time.Duration) (*Line, error) {
	if delay <= 0 {
		return nil, fmt.Errorf("delay line %s-%s: delay %v is not positive", a, b, delay)
	}
	l := &Line{delay: delay, fds: [2]int{-1, -1}}
	for i, name := range []string{a, b} {
		err := netnsrun.Do(nsPath, func() error {
			fd, err := openPacketSocket(name)
			l.fds[i] = fd
			return err
		})
		if err != nil {
			l.closeFDs()
			return nil, fmt.Errorf("delay line %s-%s in %q: %w", a, b, nsPath, err)
		}
	}
	for dir := range 2 {
		l.wg.Add(1)
		go l.pass(dir)
	}
	return l, nil
}

// openPacketSocket opens a socket that reads every frame name receives
// (not those it sends) and writes frames out of it, both with a
// virtio-net header. It is made with protocol 0, which receives nothing,
// and bound to the interface with ETH_P_ALL, so no other interface's
// frame is ever queued on it.
func openPacketSocket(name string) (int, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return -1, err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening a packet socket: %w", err)
	}
	opts := []struct {
		level, opt, value int
		name              string
	}{
		{unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1, "PACKET_VNET_HDR"},
		{unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1, "PACKET_IGNORE_OUTGOING (Linux 4.20)"},
		{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8 << 20, "SO_RCVBUFFORCE"},
		{unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 8 << 20, "SO_SNDBUFFORCE"},
		{unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1, "SO_TIMESTAMPNS"},
	}
	for _, o := range opts {
		if err := unix.SetsockoptInt(fd, o.level, o.opt, o.value); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("setting %s on %s's packet socket: %w", o.name, name, err)
		}
	}
	// A reader blocked in recv wakes this often to see whether the line
	// is closing (closing a socket does not wake its readers).
	tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("setting SO_RCVTIMEO on %s's packet socket: %w", name, err)
	}
	sa := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifc.Index}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("binding a packet socket to %s: %w", name, err)
	}
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// pass moves direction dir's frames: each read with the kernel's time of
// its arrival, held until that time plus the delay, then written out of
// the other interface. One thread does both, so a frame costs no hand-off
// between threads; frames that arrive while it sleeps wait in the
// socket's queue and keep their arrival time, so a burst leaves spaced
// as it came, each one delay late.
func (l *Line) pass(dir int) {
	defer l.wg.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// The thread's sleeps end within 1 µs of their time, not the
	// default 50 µs slack. The thread is this goroutine's alone while
	// locked; it goes back to the scheduler with the slack reset.
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	defer unix.Prctl(unix.PR_SET_TIMERSLACK, 0, 0, 0, 0)
	in, out := l.fds[dir], l.fds[1-dir]
	buf := make([]byte, frameMax)
	oob := make([]byte, unix.CmsgSpace(int(unsafe.Sizeof(unix.Timespec{}))))
	for !l.stop.Load() {
		n, oobn, _, _, err := unix.Recvmsg(in, buf, oob, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		due, ok := arrival(oob[:oobn])
		if !ok {
			// No timestamp (never seen): the time it was read.
			_ = unix.ClockGettime(unix.CLOCK_REALTIME, &due)
		}
		due = unix.NsecToTimespec(due.Nano() + int64(l.delay))
		for {
			err := unix.ClockNanosleep(unix.CLOCK_REALTIME, unix.TIMER_ABSTIME, &due, nil)
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
		if _, err := unix.Write(out, buf[:n]); err != nil {
			// The interface refused it (down, or gone while closing):
			// lost as on a broken wire.
			l.dropped[dir].Add(1)
		} else {
			l.passed[dir].Add(1)
		}
	}
}

// arrival reads the SCM_TIMESTAMPNS control message: when the frame
// reached the interface (CLOCK_REALTIME).
func arrival(oob []byte) (unix.Timespec, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return unix.Timespec{}, false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(unix.Timespec{})) {
			return *(*unix.Timespec)(unsafe.Pointer(&m.Data[0])), true
		}
	}
	return unix.Timespec{}, false
}

// Stats returns the frames passed and dropped, a to b and b to a: those
// the interface refused, and those the kernel dropped because the
// socket's queue (8 MiB, the line's buffer) was full.
func (l *Line) Stats() (passed, dropped [2]uint64) {
	for i := range 2 {
		if st, err := unix.GetsockoptTpacketStats(l.fds[i], unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
			l.dropped[i].Add(uint64(st.Drops)) // reading resets them
		}
		passed[i], dropped[i] = l.passed[i].Load(), l.dropped[i].Load()
	}
	return passed, dropped
}

// Close stops the line and closes its sockets. Frames still in flight are
// sent first (at most one delay).
func (l *Line) Close() {
	l.stop.Store(true)
	l.wg.Wait()
	l.closeFDs()
}

func (l *Line) closeFDs() {
	for i, fd := range l.fds {
		if fd >= 0 {
			unix.Close(fd)
			l.fds[i] = -1
		}
	}
}
