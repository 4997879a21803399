package reconciler

import (
	"context"
	"sync"
	"time"
)

// runner calls fn once per burst of triggers, as kube-proxy's
// BoundedFrequencyRunner does: triggers that arrive while fn runs are
// coalesced into one more run, runs are at least minInterval apart, and a
// failed run is retried after retryAfter even with no new trigger.
type runner struct {
	mu          sync.Mutex // held by each run of fn and by exclusive
	fn          func() error
	kick        chan struct{}
	minInterval time.Duration
	retryAfter  time.Duration
}

func newRunner(fn func() error, minInterval, retryAfter time.Duration) *runner {
	return &runner{fn: fn, kick: make(chan struct{}, 1), minInterval: minInterval, retryAfter: retryAfter}
}

// trigger asks for a run; it never blocks.
func (r *runner) trigger() {
	select {
	case r.kick <- struct{}{}:
	default: // a run is already pending: this trigger joins it
	}
}

// loop runs until ctx ends.
func (r *runner) loop(ctx context.Context) {
	var retry <-chan time.Time
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-retry:
		}
		if wait := r.minInterval - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		last = time.Now()
		retry = nil
		r.mu.Lock()
		err := r.fn()
		r.mu.Unlock()
		if err != nil {
			retry = time.After(r.retryAfter)
		}
	}
}

// exclusive runs fn while no run of the runner's fn is in progress, and
// holds the next one back until fn returns.
func (r *runner) exclusive(fn func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fn()
}
