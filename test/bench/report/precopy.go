package report

import (
	"fmt"
	"strconv"
	"time"
)

// PreCopyResult is one case of the series.
type PreCopyResult struct {
	Case        string // "idle" or "dirty 1"
	Frozen      []time.Duration
	Total       []time.Duration
	PlainFrozen []time.Duration
	PlainTotal  []time.Duration
	Rounds      []int
	FrozenCopy  []string // the memory copied while frozen, as snapctl prints it
	// Identical counts the runs whose pre-copy image (index and pages
	// files) was the plain dump's byte for byte.
	Identical int
	// Restored: the pre-copy snapshot of the last run, restored, answered
	// touch 1 and token as the original server did.
	Restored bool
}

func validatePreCopy(runs int, sr *SizeResult, bad func(string, ...any)) {
	for _, r := range sr.PreCopy {
		if len(r.Frozen) != runs || len(r.PlainFrozen) != runs {
			bad("precopy %s: %d runs, want %d", r.Case, len(r.Frozen), runs)
		}
		for _, d := range append(append([]time.Duration{}, r.Frozen...), r.Total...) {
			if d <= 0 {
				bad("precopy %s: a time of %v", r.Case, d)
			}
		}
		if r.Case == "idle" && r.Identical != runs {
			bad("precopy idle: %d of %d images identical to the plain dump's", r.Identical, runs)
		}
		if !r.Restored {
			bad("precopy %s: the pre-copy snapshot did not restore to the original's answers", r.Case)
		}
	}
}

func renderPreCopy(m *md, sr *SizeResult) {
	if len(sr.PreCopy) == 0 {
		return
	}
	m.p("### Pre-copy dumps (`dump --pre-copy --leave-running`)\n")
	m.p("Each run starts a server, dumps it with `--pre-copy --leave-running`, then at once with `--leave-running` alone (plain), " +
		"median (min–max). *Frozen* is the process's stop for the snapshot (pre-copy also stops it a few ms earlier to set up " +
		"write tracking, not counted); targets: ≤ 50 ms idle, ≤ 150 ms under `dirty 1` (1%% of memory written per second). " +
		"*Identical*: runs where, the server then stopped by SIGSTOP, a pre-copy dump's memory equals a plain dump's byte for byte but for the threads' rseq areas (where the kernel writes the CPU a thread returns to user mode on, which the dumps' injected calls make it do); " +
		"the last run's pre-copy snapshot is restored and must answer `touch 1` and `token` as the original did.\n")
	m.header("server", "frozen, pre-copy", "frozen, plain", "dump, pre-copy", "dump, plain", "rounds", "frozen copy (last run)", "identical")
	for _, r := range sr.PreCopy {
		ident := "—"
		if r.Case == "idle" {
			ident = fmt.Sprintf("%d/%d", r.Identical, len(r.Frozen))
		}
		rounds := "—"
		if len(r.Rounds) > 0 {
			rounds = strconv.Itoa(r.Rounds[len(r.Rounds)-1])
		}
		last := "—"
		if len(r.FrozenCopy) > 0 {
			last = r.FrozenCopy[len(r.FrozenCopy)-1]
		}
		m.row(r.Case, Summarize(r.Frozen).String(), Summarize(r.PlainFrozen).String(), Summarize(r.Total).String(),
			Summarize(r.PlainTotal).String(), rounds, last, ident)
	}
	m.p("")
}
