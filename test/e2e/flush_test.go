package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/dpinfo"
)

// TestConntrackFlush: a pod quarantined by a NetworkPolicy while its
// connection is open keeps it (connection tracking admitted it at its
// start); `shunt map flush conntrack` has every connection recorded anew
// from its next packet, whichever end sends it: the quarantined pod's
// connection, which policy now refuses both ways, ends; the client's, which
// policy admits, goes on over the same connection without one failed
// attempt. The same with socket acceleration on: both connections are
// accelerated, and after the flush their sockets take the stack, where tc
// judges them (accel-untracked). The maps the agent writes are refused.
func TestConntrackFlush(t *testing.T) {
	t.Run("tc", func(t *testing.T) { testConntrackFlush(t, false) })
	t.Run("accelerated", func(t *testing.T) { testConntrackFlush(t, true) })
}

func testConntrackFlush(t *testing.T, accel bool) {
	l := newLab(t, "redirect-peer", servicesManifest, "testdata/other-pod.yaml")
	l.waitWebServes()
	web := l.clusterIP("web")
	if accel {
		l.mustShunt("accel", "on")
	}
	start := l.status()
	client := l.startLoad("client", "--persistent", "--tcp", web+":80")
	quarantined := l.startLoad("other", "--persistent", "--tcp", web+":80")
	time.Sleep(time.Second)

	l.mustShunt("apply", "-f", "testdata/quarantine-other.yaml")
	l.probe("other", "timeout", "--tcp", web+":80") // a new connection is refused
	time.Sleep(2 * time.Second)                     // the open one is not: tracked
	preFlush := l.status()
	flushed := time.Now()
	out := l.mustShunt("map", "flush", "conntrack", "-o", "json")
	var res []dpinfo.MapFlush
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("map flush conntrack -o json: %v\n%s", err, out)
	}
	removed := 0
	var names []string
	for _, r := range res {
		names = append(names, r.Map)
		removed += r.Removed
	}
	if strings.Join(names, ",") != "shunt_ct,shunt_ct_new" || removed < 2 {
		t.Errorf("map flush conntrack flushed %v, %d entries; want shunt_ct and shunt_ct_new, the two long connections' entries at least", names, removed)
	}
	time.Sleep(3 * time.Second)
	clientRuns, quarantinedRuns := client.stop(), quarantined.stop()
	if accel {
		end := l.status()
		delta := func(from, to status, reason string) uint64 {
			return to.counter(reason, "sockmsg") - from.counter(reason, "sockmsg")
		}
		added, redirected := delta(start, preFlush, "accel-added"), delta(start, preFlush, "accel-redirected")
		untrackedBefore, untracked := delta(start, preFlush, "accel-untracked"), delta(preFlush, end, "accel-untracked")
		t.Logf("before the flush: accel-added +%d, accel-redirected +%d, accel-untracked +%d; after it: accel-untracked +%d",
			added, redirected, untrackedBefore, untracked)
		if added < 4 || redirected == 0 || untrackedBefore != 0 {
			t.Errorf("before the flush: accel-added +%d, accel-redirected +%d, accel-untracked +%d; "+
				"want both connections' four sockets accelerated, none leaving the redirect", added, redirected, untrackedBefore)
		}
		// Each connection's sending end at least: the client's and the
		// quarantined pod's (the server's answers to the client find the
		// entry the client's next segment recorded again).
		if untracked < 2 {
			t.Errorf("after the flush: accel-untracked +%d; want the two connections' sending sockets at least", untracked)
		}
	}

	if ok, all, failed := tally(clientRuns, "tcp"); ok != all || all == 0 || distinctLocals(clientRuns) != 1 {
		t.Errorf("the admitted client's connection: %d of %d attempts connected over %d connections; want all over one; failures: %v",
			ok, all, distinctLocals(clientRuns), failed)
	}
	// The quarantined pod's attempts: connected until the flush (one in flight at
	// the flush may still be answered), none from a second after it.
	var before, beforeOK, after, afterOK int
	for _, r := range quarantinedRuns {
		switch {
		case r.Start.Before(flushed):
			before++
			if r.Result == "connected" {
				beforeOK++
			}
		case r.Start.After(flushed.Add(time.Second)):
			after++
			if r.Result == "connected" {
				afterOK++
			}
		}
	}
	if before == 0 || beforeOK != before {
		t.Errorf("the quarantined pod's open connection before the flush: %d of %d attempts connected; want all (a quarantine leaves tracked connections open)", beforeOK, before)
	}
	if after == 0 || afterOK != 0 {
		t.Errorf("the quarantined pod after the flush: %d of %d attempts connected; want none", afterOK, after)
	}

	if out, code := l.shunt("map", "flush", "shunt_services"); code == 0 || !strings.Contains(out, "not flushed") || !strings.Contains(out, "shunt sync") {
		t.Errorf("map flush shunt_services: exit %d, %s; want a refusal naming shunt sync", code, out)
	}
	if out, code := l.shunt("map", "flush", "shunt_nosuch"); code == 0 || !strings.Contains(out, "shunt map list") {
		t.Errorf("map flush shunt_nosuch: exit %d, %s; want an error naming shunt map list", code, out)
	}
}
