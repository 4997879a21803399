package e2e

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/shuntnet/shunt/internal/instance"
	"github.com/shuntnet/shunt/internal/podnet"
)

// inPod runs f on a thread of its own inside a pod's network namespace
// (the thread is discarded afterwards, never returned to Go's pool).
func (l *lab) inPod(ns, pod string, f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		h, err := netns.GetFromPath(l.podNetnsPath(ns, pod))
		if err == nil {
			err = netns.Set(h)
			h.Close()
		}
		if err != nil {
			done <- err
			return
		}
		done <- f()
	}()
	return <-done
}

// podNetnsPath is where the network namespace of pod ns/name is, on
// whichever node of the lab runs it.
func (l *lab) podNetnsPath(ns, pod string) string {
	inst, _ := instance.New(l.instance)
	first := podnet.NetnsPath(inst.PodNetns(ns, pod))
	if len(l.instance) > 8 {
		return first // a lab of one node
	}
	for k := 1; k <= 9; k++ {
		ni, _ := instance.New(l.node(k).instance)
		if p := podnet.NetnsPath(ni.PodNetns(ns, pod)); fileExists(p) {
			return p
		}
	}
	return first
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestServiceTCFallback: a datagram to a ClusterIP sent from a raw socket,
// which no socket hook sees, is translated per packet by the tc program on
// the pod's veth: it reaches a backend, and the backend's reply comes back
// from the ClusterIP to an ordinary socket on the sending port.
func TestServiceTCFallback(t *testing.T) {
	l := newLab(t, "redirect-peer", servicesManifest)
	vip := netip.MustParseAddr(l.clusterIP("web"))
	l.probe("client", "connected", "--udp", vip.String()+":53") // the backends listen

	backends := map[string]int{}
	err := l.inPod("default", "client", func() error {
		for i := 0; i < 8; i++ {
			port := 41000 + i
			rx, err := net.ListenUDP("udp4", &net.UDPAddr{Port: port})
			if err != nil {
				return err
			}
			defer rx.Close()
			raw, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_UDP)
			if err != nil {
				return err
			}
			defer syscall.Close(raw)
			payload := []byte("ping")
			udp := make([]byte, 8+len(payload))
			binary.BigEndian.PutUint16(udp[0:], uint16(port))
			binary.BigEndian.PutUint16(udp[2:], 53)
			binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
			copy(udp[8:], payload) // checksum 0: none (IPv4 allows it)
			// UDP may lose a datagram: three tries before calling it broken.
			buf := make([]byte, 512)
			var n int
			var from netip.AddrPort
			for try := 0; ; try++ {
				if err := syscall.Sendto(raw, udp, 0, &syscall.SockaddrInet4{Addr: vip.As4()}); err != nil {
					return fmt.Errorf("raw send to %s: %w", vip, err)
				}
				rx.SetReadDeadline(time.Now().Add(time.Second))
				if n, from, err = rx.ReadFromUDPAddrPort(buf); err == nil {
					break
				}
				if try == 2 {
					return fmt.Errorf("datagram %d: no reply to a raw send to %s:53 in 3 tries: %w", i, vip, err)
				}
			}
			if from.Addr().Unmap() != vip || from.Port() != 53 {
				return fmt.Errorf("datagram %d: reply from %s, want the ClusterIP %s:53", i, from, vip)
			}
			name, _, _ := strings.Cut(string(buf[:n]), " ")
			backends[name]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if backends["web-1"]+backends["web-2"] != 8 {
		t.Errorf("replies from %v, want only web-1 and web-2", backends)
	}
	var translated uint64
	for _, c := range l.status().Counters {
		if c.Reason == "service-translated" {
			translated += c.Packets
		}
	}
	if translated < 16 {
		t.Errorf("%d packets counted as translated by the tc fallback, want both directions of 8 exchanges", translated)
	}
}
