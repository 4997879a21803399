// Package benchrun is what the Go benchmark drivers share: result rows in
// bench/lib.sh's format, and the list of what a run built, undone at its
// end (also when it fails or is interrupted).
package benchrun

import (
	"fmt"
	"io"
	"sync"
)

// Row writes one result row (a JSON line) for bench/lib.sh's report.
func Row(w io.Writer, c, metric, unit string, value float64, rep, n int) {
	fmt.Fprintf(w, `{"case":%q,"metric":%q,"unit":%q,"value":%g,"rep":%d,"n":%d}`+"\n", c, metric, unit, value, rep, n)
}

// Undo is the list of what a run built, each with the function that
// removes it. Safe for concurrent use.
type Undo struct {
	mu sync.Mutex
	fs []func()
}

// Add records how to undo one thing the run built.
func (u *Undo) Add(f func()) {
	u.mu.Lock()
	u.fs = append(u.fs, f)
	u.mu.Unlock()
}

// Run undoes everything recorded, last first, once.
func (u *Undo) Run() {
	u.mu.Lock()
	fs := u.fs
	u.fs = nil
	u.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}
