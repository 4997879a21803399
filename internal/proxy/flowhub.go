package proxy

import (
	"sync"
	"sync/atomic"

	"github.com/shuntnet/shunt/internal/flows"
)

// flowHub hands each flow record to the readers of /flows. A reader that
// does not keep up misses records (counted); a request never waits for it.
type flowHub struct {
	mu      sync.Mutex
	subs    map[*flowSub]struct{}
	dropped atomic.Uint64
}

type flowSub struct {
	filter flows.Filter
	ch     chan flows.Flow
}

func newFlowHub() *flowHub { return &flowHub{subs: map[*flowSub]struct{}{}} }

func (h *flowHub) publish(fl flows.Flow) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
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

// subscribe delivers the matching records made from now on until cancel;
// buffer records may wait for the reader.
func (h *flowHub) subscribe(f flows.Filter, buffer int) (<-chan flows.Flow, func()) {
	s := &flowSub{filter: f, ch: make(chan flows.Flow, buffer)}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	return s.ch, func() {
		h.mu.Lock()
		delete(h.subs, s)
		h.mu.Unlock()
	}
}
