package main

import (
	"net"
	"testing"
	"time"
)

// TestStallsCounted: a server that answers every other request 250 ms late
// (as a reply retransmitted after TCP's minimum RTO would arrive) makes
// half of the connections slow exchanges and none slow connects; a connect
// of a second (a retransmitted SYN) counts as a slow connect.
func TestStallsCounted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(late bool) {
				defer c.Close()
				buf := make([]byte, 16)
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				if late {
					time.Sleep(250 * time.Millisecond)
				}
				c.Write(buf[:n])
			}(i%2 == 1)
		}
	}()
	var st stalls
	buf := make([]byte, 512)
	for range 4 {
		if err := once(ln.Addr().String(), 2*time.Second, buf, &st); err != nil {
			t.Fatal(err)
		}
	}
	f := st.fields()
	if f["slow_exchanges"] != int64(2) || f["slow_connects"] != int64(0) {
		t.Errorf("4 connections, every other reply 250 ms late: %v; want 2 slow exchanges, 0 slow connects", f)
	}
	if ms := f["max_exchange_ms"].(float64); ms < 250 || ms > 2000 {
		t.Errorf("longest exchange %.1f ms; want the late reply's 250 ms or a little more", ms)
	}
	st.note(time.Second, time.Millisecond)
	if n := st.slowConnects.Load(); n != 1 {
		t.Errorf("a 1-second connect (a SYN retransmitted): %d slow connects, want 1", n)
	}
}
