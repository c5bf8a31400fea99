package ptrace

import "slices"

// Processes returns the processes the tracer holds attached, in pid
// order: those it seized or started, and those it auto-attached because a
// resumed process forked with PTRACE_O_TRACEFORK or PTRACE_O_TRACEVFORK
// (so that they can be detached, or killed, in turn).
func (t *Tracer) Processes() []*Process {
	var out []*Process
	_ = t.Do(func() error {
		for _, p := range t.procs {
			if p.attached {
				out = append(out, p)
			}
		}
		return nil
	})
	slices.SortFunc(out, func(a, b *Process) int { return a.pid - b.pid })
	return out
}
