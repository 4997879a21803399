package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/shuntnet/shunt/internal/dpinfo"
	"golang.org/x/sys/unix"
)

// FlowMode is how much the datapath reports (enum flow_mode).
type FlowMode uint32

const (
	FlowModeOff     = FlowMode(podtcFlowModeFLOW_MODE_OFF)
	FlowModeDefault = FlowMode(podtcFlowModeFLOW_MODE_DEFAULT) // dpinfo.FlowModeDefaultReports
	FlowModeAll     = FlowMode(podtcFlowModeFLOW_MODE_ALL)     // every packet
)

// ParseFlowMode reads a --flow-sampling value.
func ParseFlowMode(s string) (FlowMode, error) {
	switch s {
	case "off":
		return FlowModeOff, nil
	case "", "default":
		return FlowModeDefault, nil
	case "all":
		return FlowModeAll, nil
	}
	return 0, fmt.Errorf("unknown flow sampling %q: use %s", s, dpinfo.FlowModeChoices)
}

func (m FlowMode) String() string {
	switch m {
	case FlowModeOff:
		return "off"
	case FlowModeAll:
		return "all"
	}
	return "default"
}

// FlowEvent is one decoded event of the shunt_flows ring buffer.
type FlowEvent struct {
	Time        time.Time
	CgroupID    uint64 // socket hooks: the caller's cgroup
	Src, Dst    netip.Addr
	SrcPort     uint16
	DstPort     uint16
	OrigDst     netip.Addr // the service address before translation (invalid: none)
	OrigDstPort uint16
	Proto       uint8
	TCPFlags    uint8
	Verdict     string // FORWARDED, DROPPED, TRANSLATED, REDIRECTED
	Reason      string // as the counters name it
	Point       string // from-pod, to-pod, from-overlay, socket
	Event       string // packet, new, answer, end, drop, socket, icmp-error
	// An icmp-error event's error, e.g. port-unreachable,
	// fragmentation-needed, ttl-exceeded (icmpErrorName).
	ICMPError   string
	Ifindex     uint32
	SrcIdentity uint32
	DstIdentity uint32
	RuleID      uint32
	Length      uint32
	// An accelerated socket's end (reason accel-ended): what it sent
	// through the redirect, which no packet event saw.
	Bytes, Messages uint64
}

func decodeFlow(raw []byte, boot time.Time) (FlowEvent, error) {
	var e podtcFlowEvent
	if _, err := binary.Decode(raw, binary.NativeEndian, &e); err != nil {
		return FlowEvent{}, fmt.Errorf("decoding flow event (%d bytes): %w", len(raw), err)
	}
	f := FlowEvent{
		Time: boot.Add(time.Duration(e.TsNs)), CgroupID: e.CgroupId,
		Src: fromBe32(e.Saddr), Dst: fromBe32(e.Daddr), SrcPort: fromBe16(e.Sport), DstPort: fromBe16(e.Dport),
		Proto: e.Proto, TCPFlags: e.TcpFlags, Verdict: name(flowVerdictNames[:], e.Verdict),
		Reason: dpinfo.Reason(e.Reason).String(), Point: name(flowPointNames[:], e.Point), Event: name(flowEventNames[:], e.Event),
		Ifindex: e.Ifindex, SrcIdentity: e.SrcIdentity, DstIdentity: e.DstIdentity, RuleID: e.RuleId, Length: e.Len,
	}
	if e.OrigDaddr != 0 {
		f.OrigDst, f.OrigDstPort = fromBe32(e.OrigDaddr), fromBe16(e.OrigDport)
	}
	if e.Event == uint8(podtcFlowEventTypeFLOW_EV_ICMP_ERROR) {
		f.ICMPError, f.TCPFlags = icmpErrorName(e.TcpFlags), 0 // the byte holds the error there
	}
	if e.Reason == uint8(podtcShuntReasonSHUNT_REASON_ACCEL_ENDED) {
		f.Bytes, f.Messages, f.Length = e.Bytes, uint64(e.Len), 0 // len holds the sends there
	}
	return f, nil
}

// SetFlowMode says what the programs report from now on.
func (d *Datapath) SetFlowMode(m FlowMode) error {
	v := podtcFlowConfig{Mode: uint32(m)}
	return d.drift.setFlows(v, func() error {
		if err := d.objs.ShuntFlowConfig.Put(uint32(0), v); err != nil {
			return fmt.Errorf("writing shunt_flow_config: %w", err)
		}
		return nil
	})
}

// FlowStats are the events sent and lost (ring buffer full) since the
// counters' map was created.
func (d *Datapath) FlowStats() (emitted, lost uint64, err error) {
	var perCPU []podtcFlowStats
	if err := d.objs.ShuntFlowStats.Lookup(uint32(0), &perCPU); err != nil {
		return 0, 0, fmt.Errorf("reading shunt_flow_stats: %w", err)
	}
	for _, s := range perCPU {
		emitted += s.Emitted
		lost += s.Lost
	}
	return emitted, lost, nil
}

// FlowReader reads flow events until Close.
type FlowReader struct {
	r    *ringbuf.Reader
	rec  ringbuf.Record // reused: no allocation per event
	boot time.Time      // wall-clock time of monotonic zero
}

// Flows opens a reader on the ring buffer.
func (d *Datapath) Flows() (*FlowReader, error) {
	r, err := ringbuf.NewReader(d.objs.ShuntFlows)
	if err != nil {
		return nil, fmt.Errorf("opening the flow ring buffer: %w", err)
	}
	return &FlowReader{r: r, boot: monotonicZero()}, nil
}

// FlowPollInterval is how long events may wait in the ring buffer before
// the reader collects them: the programs wake the reader only for drops or
// a quarter-full buffer (see flow_submit), so the rest is polled.
const FlowPollInterval = 100 * time.Millisecond

// Read blocks for the next event; after Close it returns os.ErrClosed.
func (fr *FlowReader) Read() (FlowEvent, error) {
	for {
		fr.r.SetDeadline(time.Now().Add(FlowPollInterval))
		err := fr.r.ReadInto(&fr.rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue // nothing left: poll again
		}
		if errors.Is(err, ringbuf.ErrClosed) {
			return FlowEvent{}, os.ErrClosed
		}
		if err != nil {
			return FlowEvent{}, err
		}
		return decodeFlow(fr.rec.RawSample, fr.boot)
	}
}

// Close stops Read.
func (fr *FlowReader) Close() error { return fr.r.Close() }

// flowBufferSize rounds a requested ring buffer size to what the kernel
// accepts: a power of two, at least one page.
func flowBufferSize(bytes int) uint32 {
	size := uint32(os.Getpagesize())
	for int(size) < bytes && size < 1<<30 {
		size <<= 1
	}
	return size
}

// monotonicZero is the wall-clock time at which CLOCK_MONOTONIC (what
// bpf_ktime_get_ns reads) was zero.
func monotonicZero() time.Time {
	var ts unix.Timespec
	now := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return now
	}
	return now.Add(-time.Duration(ts.Nano()))
}
