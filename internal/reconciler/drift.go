package reconciler

// Exclusive runs fn between syncs: never while one writes the datapath,
// and the next waits for fn to return. Drift checks run through it, so a
// check compares the kernel with what the last whole sync wrote.
func (r *Reconciler) Exclusive(fn func()) { r.run.exclusive(fn) }
