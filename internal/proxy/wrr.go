package proxy

import "sync"

// wrr is nginx's smooth weighted round robin. Over any sum(weights)
// consecutive picks each item is picked exactly its weight times, spread
// out rather than in runs, so a 90/10 split holds per request and over
// short windows, on one connection as over many.
type wrr struct {
	mu      sync.Mutex
	weights []int64
	current []int64
	total   int64
}

func newWRR(weights []int32) *wrr {
	w := &wrr{weights: make([]int64, len(weights)), current: make([]int64, len(weights))}
	for i, v := range weights {
		w.weights[i] = int64(v)
		w.total += int64(v)
	}
	return w
}

// pick returns the index of the next item, -1 when every weight is 0.
func (w *wrr) pick() int {
	if w.total == 0 {
		return -1
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	best := -1
	for i, v := range w.weights {
		w.current[i] += v
		if v > 0 && (best < 0 || w.current[i] > w.current[best]) {
			best = i
		}
	}
	w.current[best] -= w.total
	return best
}
