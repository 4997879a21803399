package agent

import (
	"sync"

	"github.com/shuntnet/shunt/internal/datapath"
	"github.com/shuntnet/shunt/internal/steerroute"
)

// steerRouting is the routing that delivers the connections tc steers to
// the node proxy to the node's stack (internal/steerroute), held only
// while some port's connections go to the proxy: a routing rule makes
// every route lookup of the namespace walk the rules (the kernel never
// goes back to its fast path once a rule was added), which a node without
// HTTP rules need not pay.
type steerRouting struct {
	mu      sync.Mutex
	routing steerroute.Routing
	claimed bool
	known   bool // claimed says what is on record (false at start: an earlier agent's claim may be there)
}

// setSteerRouting claims the routing (needed) or releases it; the
// reconciler calls it before it writes redirections to the proxy and after
// it removed the last one.
func (a *Agent) setSteerRouting(needed bool) error {
	s := a.steer
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known && s.claimed == needed {
		return nil
	}
	var err error
	if needed {
		err = steerroute.Claim(a.cfg.Instance, s.routing)
	} else {
		err = steerroute.Release(a.cfg.Instance)
	}
	if err != nil {
		s.known = false // tried again at the next sync
		return err
	}
	s.claimed, s.known = needed, true
	return nil
}

// verifySteerRouting adds the steering routing, while it is claimed, to r
// (a rule and a route, not map entries, but as much the agent's decision),
// and puts what is missing back with repair.
func (a *Agent) verifySteerRouting(r *datapath.DriftReport, repair bool) error {
	s := a.steer
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.claimed {
		return nil
	}
	missing, err := steerroute.Check(a.cfg.Instance, s.routing, repair)
	if err != nil {
		return err
	}
	r.Checked[steerroute.DriftName] = 2
	for _, m := range missing {
		r.Entries = append(r.Entries, datapath.DriftEntry{Map: steerroute.DriftName, Key: m, Expected: "present"})
	}
	if repair && len(missing) > 0 {
		r.Repaired[steerroute.DriftName] += len(missing)
	}
	return nil
}
