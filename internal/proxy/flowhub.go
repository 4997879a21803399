package proxy

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/shuntnet/shunt/internal/flows"
)

// flowHub hands each flow record to the readers of /flows. A reader that
// does not keep up misses records (counted); a request never waits for it.
// The readers are a list replaced whole when one comes or goes, so a
// request takes no lock to find them (publish runs once per request, on
// every event loop).
type flowHub struct {
	mu      sync.Mutex // serializes changes to subs
	subs    atomic.Pointer[[]*flowSub]
	dropped atomic.Uint64
}

type flowSub struct {
	filter flows.Filter
	ch     chan flows.Flow
}

func newFlowHub() *flowHub { return &flowHub{} }

func (h *flowHub) publish(fl flows.Flow) {
	subs := h.subs.Load()
	if subs == nil {
		return
	}
	for _, s := range *subs {
		if !s.filter.Match(&fl) {
			continue
		}
		select {
		case s.ch <- fl:
		default:
			h.dropped.Add(1)
		}
	}
}

// readers is how many readers take records.
func (h *flowHub) readers() int {
	if subs := h.subs.Load(); subs != nil {
		return len(*subs)
	}
	return 0
}

// subscribe delivers the matching records made from now on until cancel;
// buffer records may wait for the reader.
func (h *flowHub) subscribe(f flows.Filter, buffer int) (<-chan flows.Flow, func()) {
	s := &flowSub{filter: f, ch: make(chan flows.Flow, buffer)}
	h.change(func(subs []*flowSub) []*flowSub { return append(subs, s) })
	return s.ch, func() {
		h.change(func(subs []*flowSub) []*flowSub {
			return slices.DeleteFunc(subs, func(o *flowSub) bool { return o == s })
		})
	}
}

// change replaces the readers with edit's result on a copy of them.
func (h *flowHub) change(edit func([]*flowSub) []*flowSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var subs []*flowSub
	if old := h.subs.Load(); old != nil {
		subs = slices.Clone(*old)
	}
	subs = edit(subs)
	h.subs.Store(&subs)
}
