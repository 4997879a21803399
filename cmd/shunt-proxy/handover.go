package main

import (
	"context"
	"os"
	"time"

	"github.com/shuntnet/shunt/internal/proxyapi"
)

// waitForSuccessor keeps this proxy accepting, for at most wait, until
// another proxy answers on the control socket's path. A successor takes
// the path only after it listens on the data address (SO_REUSEPORT), so
// once it answers this proxy can stop accepting without a moment where
// nobody listens. It says whether a successor showed up; a plain stop
// waits the whole time.
func waitForSuccessor(control string, wait time.Duration) bool {
	c := proxyapi.NewClient(control)
	deadline := time.Now().Add(wait)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		st, err := c.Status(ctx)
		cancel()
		if err == nil && st.PID != os.Getpid() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
