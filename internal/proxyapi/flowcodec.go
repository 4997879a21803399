package proxyapi

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/shuntnet/shunt/internal/flows"
)

// FlowBatchType is the content type of GET /flows?format=batch: flow
// records in batches, in a compact binary form. A proxy that does not
// know it answers JSON lines, which Client.Flows reads too.
const FlowBatchType = "application/vnd.shunt.flow-batch"

// The batch form: frames, each a uvarint length and that many bytes: a
// uvarint count, then the records. A record is every field of flows.Flow
// in declaration order: strings, integers as varints, time as Unix
// nanoseconds, a pointer as a presence byte then its fields. Strings go
// through a dictionary the stream builds: uvarint 0 then a length and the
// bytes is a string said once; 1 then a length and the bytes adds it to the
// dictionary; k ≥ 2 is entry k-2. Names, labels, routes and backends
// repeat from one request to the next, so a record is mostly small
// numbers.
const (
	maxDictEntries = 4096
	maxDictString  = 128 // longer strings (paths with ids, errors) are said once
	maxFrameBytes  = 16 << 20
)

// FlowEncoder writes batches of flows to one stream.
type FlowEncoder struct {
	w    io.Writer
	dict map[string]uint64
	buf  []byte
}

func NewFlowEncoder(w io.Writer) *FlowEncoder {
	return &FlowEncoder{w: w, dict: map[string]uint64{}}
}

// Encode writes one batch as one frame.
func (e *FlowEncoder) Encode(batch []flows.Flow) error {
	b := binary.AppendUvarint(e.buf[:0], uint64(len(batch)))
	for i := range batch {
		b = e.appendFlow(b, &batch[i])
	}
	frame := binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64+len(b)), uint64(len(b)))
	e.buf = b
	_, err := e.w.Write(append(frame, b...))
	return err
}

func (e *FlowEncoder) str(b []byte, s string) []byte {
	if k, ok := e.dict[s]; ok {
		return binary.AppendUvarint(b, k+2)
	}
	tag := uint64(0)
	if len(s) <= maxDictString && len(e.dict) < maxDictEntries {
		e.dict[s] = uint64(len(e.dict))
		tag = 1
	}
	b = binary.AppendUvarint(b, tag)
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func (e *FlowEncoder) endpoint(b []byte, ep *flows.Endpoint) []byte {
	b = e.str(b, ep.Pod)
	b = e.str(b, ep.Namespace)
	b = e.str(b, ep.IP)
	b = binary.AppendUvarint(b, uint64(ep.Port))
	b = binary.AppendUvarint(b, uint64(ep.Identity))
	b = binary.AppendUvarint(b, uint64(len(ep.Labels)))
	for _, l := range ep.Labels {
		b = e.str(b, l)
	}
	return appendBool(b, ep.Labels != nil)
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

func (e *FlowEncoder) appendFlow(b []byte, f *flows.Flow) []byte {
	b = binary.AppendVarint(b, f.Time.UnixNano())
	for _, s := range []string{f.Node, f.Verdict, f.DropReason, f.Reason, f.Event, f.Point} {
		b = e.str(b, s)
	}
	b = e.endpoint(b, &f.Source)
	b = e.endpoint(b, &f.Destination)
	b = e.str(b, f.Protocol)
	b = e.str(b, f.TCPFlags)
	b = e.str(b, f.ICMPError)
	b = appendBool(b, f.Service != nil)
	if s := f.Service; s != nil {
		b = e.str(b, s.Name)
		b = e.str(b, s.IP)
		b = binary.AppendUvarint(b, uint64(s.Port))
	}
	b = e.str(b, f.Interface)
	b = e.str(b, f.Policy)
	b = binary.AppendUvarint(b, uint64(f.RuleID))
	b = binary.AppendUvarint(b, uint64(f.Length))
	b = binary.AppendUvarint(b, f.Bytes)
	b = binary.AppendUvarint(b, f.Messages)
	b = appendBool(b, f.HTTP != nil)
	if h := f.HTTP; h != nil {
		for _, s := range []string{h.Method, h.Path, h.Host, h.Protocol} {
			b = e.str(b, s)
		}
		b = binary.AppendVarint(b, int64(h.Status))
		b = binary.AppendVarint(b, h.LatencyMicros)
		for _, s := range []string{h.Route, h.Backend, h.BackendPod, h.Error} {
			b = e.str(b, s)
		}
	}
	return b
}

// FlowDecoder reads the batches of one stream.
type FlowDecoder struct {
	r    *bufio.Reader
	dict []string
	buf  []byte
	pos  int
	err  error
}

func NewFlowDecoder(r io.Reader) *FlowDecoder { return &FlowDecoder{r: bufio.NewReader(r)} }

var errBadBatch = errors.New("malformed flow batch")

// Decode reads one batch and calls each for its records; io.EOF at the
// end of the stream.
func (d *FlowDecoder) Decode(each func(flows.Flow)) error {
	n, err := binary.ReadUvarint(d.r)
	if err != nil {
		return err
	}
	if n > maxFrameBytes {
		return fmt.Errorf("%w: a frame of %d bytes", errBadBatch, n)
	}
	if uint64(cap(d.buf)) < n {
		d.buf = make([]byte, n)
	}
	d.buf, d.pos, d.err = d.buf[:n], 0, nil
	if _, err := io.ReadFull(d.r, d.buf); err != nil {
		return fmt.Errorf("%w: %w", errBadBatch, io.ErrUnexpectedEOF)
	}
	count := d.uvarint()
	for i := uint64(0); i < count && d.err == nil; i++ {
		f := d.flow()
		if d.err == nil {
			each(f)
		}
	}
	if d.err == nil && d.pos != len(d.buf) {
		d.err = errBadBatch
	}
	return d.err
}

func (d *FlowDecoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.buf[d.pos:])
	if n <= 0 {
		d.fail()
		return 0
	}
	d.pos += n
	return v
}

func (d *FlowDecoder) varint() int64 {
	v, n := binary.Varint(d.buf[d.pos:])
	if n <= 0 {
		d.fail()
		return 0
	}
	d.pos += n
	return v
}

func (d *FlowDecoder) fail() {
	if d.err == nil {
		d.err = errBadBatch
	}
	d.pos = len(d.buf)
}

func (d *FlowDecoder) bool() bool {
	if d.pos >= len(d.buf) || d.buf[d.pos] > 1 {
		d.fail()
		return false
	}
	d.pos++
	return d.buf[d.pos-1] == 1
}

func (d *FlowDecoder) str() string {
	tag := d.uvarint()
	if tag >= 2 {
		if tag-2 >= uint64(len(d.dict)) {
			d.fail()
			return ""
		}
		return d.dict[tag-2]
	}
	n := d.uvarint()
	if n > uint64(len(d.buf)-d.pos) {
		d.fail()
		return ""
	}
	s := string(d.buf[d.pos : d.pos+int(n)])
	d.pos += int(n)
	if tag == 1 {
		d.dict = append(d.dict, s)
	}
	return s
}

func (d *FlowDecoder) endpoint(ep *flows.Endpoint) {
	ep.Pod, ep.Namespace, ep.IP = d.str(), d.str(), d.str()
	ep.Port, ep.Identity = uint16(d.uvarint()), uint32(d.uvarint())
	n := d.uvarint()
	if n > uint64(len(d.buf)) {
		d.fail()
		return
	}
	labels := make([]string, 0, n)
	for range n {
		labels = append(labels, d.str())
	}
	if d.bool() {
		ep.Labels = labels
	}
}

func (d *FlowDecoder) flow() flows.Flow {
	var f flows.Flow
	f.Time = time.Unix(0, d.varint())
	f.Node, f.Verdict, f.DropReason, f.Reason, f.Event, f.Point = d.str(), d.str(), d.str(), d.str(), d.str(), d.str()
	d.endpoint(&f.Source)
	d.endpoint(&f.Destination)
	f.Protocol, f.TCPFlags, f.ICMPError = d.str(), d.str(), d.str()
	if d.bool() {
		f.Service = &flows.Service{Name: d.str(), IP: d.str()}
		f.Service.Port = uint16(d.uvarint())
	}
	f.Interface, f.Policy = d.str(), d.str()
	f.RuleID, f.Length = uint32(d.uvarint()), uint32(d.uvarint())
	f.Bytes, f.Messages = d.uvarint(), d.uvarint()
	if d.bool() {
		h := &flows.HTTP{Method: d.str(), Path: d.str(), Host: d.str(), Protocol: d.str()}
		h.Status, h.LatencyMicros = int(d.varint()), d.varint()
		h.Route, h.Backend, h.BackendPod, h.Error = d.str(), d.str(), d.str(), d.str()
		f.HTTP = h
	}
	return f
}
