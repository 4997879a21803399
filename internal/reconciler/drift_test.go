package reconciler

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestExclusiveWaitsForSync: a drift check never overlaps a sync, and a
// sync triggered during a check waits for it.
func TestExclusiveWaitsForSync(t *testing.T) {
	var inSync, inCheck atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	overlap := atomic.Bool{}
	first := true
	r := newRunner(func() error {
		inSync.Store(true)
		defer inSync.Store(false)
		if inCheck.Load() {
			overlap.Store(true)
		}
		if first {
			first = false
			close(entered)
			<-release
		}
		return nil
	}, 0, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.loop(ctx)
	r.trigger()
	<-entered
	done := make(chan struct{})
	go func() {
		r.exclusive(func() {
			inCheck.Store(true)
			if inSync.Load() {
				overlap.Store(true)
			}
			r.trigger() // a sync asked for during the check runs after it
			time.Sleep(20 * time.Millisecond)
			inCheck.Store(false)
		})
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("the check ran while a sync was in progress")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-done
	time.Sleep(50 * time.Millisecond)
	if overlap.Load() {
		t.Error("a sync and a check overlapped")
	}
}
