// Package netnsrun runs code inside another network namespace without ever
// leaving a thread of the Go scheduler in the wrong one, and without
// ending threads needlessly (a thread's end fires the Pdeathsig of the
// children it forked).
package netnsrun

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netns"
)

// ErrGone marks a namespace path that no longer exists.
var ErrGone = errors.New("network namespace is gone")

// Do runs fn on a thread in the network namespace at path ("" is this
// process's own, run on the calling goroutine). The thread is locked while it
// is elsewhere and returned to the scheduler only once back in its original
// namespace; if it cannot go back, it stays locked, and Go ends it with its
// goroutine, so no other goroutine ever runs in the wrong namespace.
func Do(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	target, err := netns.GetFromPath(path)
	if errors.Is(err, os.ErrNotExist) {
		return ErrGone
	}
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", path, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("opening this thread's network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread() // setns failed: still where it was
			errc <- fmt.Errorf("entering network namespace %s: %w", path, err)
			return
		}
		err = fn()
		if rerr := netns.Set(orig); rerr != nil {
			// Stay locked: the thread dies with this goroutine.
			errc <- errors.Join(err, fmt.Errorf("leaving network namespace %s: %w", path, rerr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}
