package report

import (
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
)

// TreeResult is the tree series of one size.
type TreeResult struct {
	Server    string
	Processes int
	Image     uint64          // the snapshot directory
	Dump      []time.Duration // snapctl's "in D"
	Freeze    []time.Duration // snapctl's "frozen F"
	Eager     []time.Duration // restore: "in D"
	Running   []time.Duration // restore --lazy: "running after A"
	AllIn     []time.Duration // restore --lazy: "all memory in after B"
}

func validateTree(runs int, sr *SizeResult, bad func(string, ...any)) {
	tr := sr.Tree
	if tr == nil {
		return
	}
	// Two dumps a run (one for each restore).
	want := map[string]int{"dump": 2 * runs, "freeze": 2 * runs, "eager": runs, "running": runs, "all in": runs}
	for name, ds := range map[string][]time.Duration{"dump": tr.Dump, "freeze": tr.Freeze, "eager": tr.Eager, "running": tr.Running, "all in": tr.AllIn} {
		if len(ds) != want[name] {
			bad("tree: %d %s figures for %d runs, want %d", len(ds), name, runs, want[name])
		}
	}
	if d, a := Summarize(tr.Running), Summarize(tr.AllIn); d.Med > a.Med {
		bad("tree: lazy restore running after %s, later than all memory in (%s)", d, a)
	}
}

func renderTree(m *md, sr *SizeResult) {
	tr := sr.Tree
	if tr == nil {
		return
	}
	m.p("### Process tree: %s", tr.Server)
	m.p("")
	m.p("nginx (Debian's) with a master and %d workers, %d processes in all, dumped (`snapctl dump -t MASTER`, snapshot %s) and restored, eagerly and with `--lazy` (a pager per process, each reading its process's memory through one private mount). Its memory does not follow the size above. Each run starts nginx twice: once for the eager restore, once for the lazy one; every restored tree serves its page with its two workers before the run counts.",
		tr.Processes-1, tr.Processes, units.FormatSize(tr.Image))
	m.p("")
	m.header("dump", "frozen", "eager restore", "lazy: running after", "lazy: all memory in")
	m.row(Summarize(tr.Dump).String(), Summarize(tr.Freeze).String(), Summarize(tr.Eager).String(), Summarize(tr.Running).String(), Summarize(tr.AllIn).String())
	m.p("")
}
