package report

import (
	"fmt"
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
)

// IncrResult are the figures of the series, one entry per run.
type IncrResult struct {
	FullBytes, IncrBytes   []int64         // the pages files of the two dumps
	FullDump, IncrDump     []time.Duration // "in D" of each dump
	FullFrozen, IncrFrozen []time.Duration
	// The incremental dump with --pre-copy --leave-running, of the same
	// memory (the server no longer writes).
	PreBytes           []int64
	PreDump, PreFrozen []time.Duration
	Dirtied            time.Duration // how long the server wrote, each run
	// Restore is the eager restore of the incremental snapshot (wall
	// time, warm page cache); Restored counts the runs whose restored
	// server answered as before the second dump.
	Restore  []time.Duration
	Restored int
}

func validateIncremental(runs int, sr *SizeResult, bad func(string, ...any)) {
	r := sr.Incremental
	if r == nil {
		return
	}
	if len(r.FullBytes) != runs || len(r.IncrBytes) != runs || len(r.Restore) != runs {
		bad("incremental: %d runs, want %d", len(r.IncrBytes), runs)
		return
	}
	for i := range r.IncrBytes {
		if r.IncrBytes[i]*20 > r.FullBytes[i] || i < len(r.PreBytes) && r.PreBytes[i]*20 > r.FullBytes[i] {
			bad("incremental run %d: pages file %d bytes, more than 5%% of the full dump's %d", i+1, r.IncrBytes[i], r.FullBytes[i])
		}
	}
	if r.Restored != runs {
		bad("incremental: %d of %d restores answered as the server did", r.Restored, runs)
	}
}

func renderIncremental(m *md, sr *SizeResult) {
	r := sr.Incremental
	if r == nil || len(r.IncrBytes) == 0 {
		return
	}
	m.p("### Incremental dumps (`dump --parent`)\n")
	m.p("Each run starts a server, dumps it whole with `--leave-running`, has it write 1%% of its memory a second (`dirty 1`) for %s, "+
		"then, its writer stopped, dumps it against the first snapshot with `--parent --pre-copy --leave-running`, then with `--parent` alone (which kills it), "+
		"and restores the second incremental snapshot eagerly: "+
		"before each incremental dump the parent's pages file is dropped from the page cache (as if dumped long ago); "+
		"it must answer `touch 1` and `token` as the server did right before the second dump. Median (min–max) of %d runs; "+
		"target: the incremental pages file at most 5%% of the full one's.\n", r.Dirtied, len(r.IncrBytes))
	med := func(ns []int64) int64 {
		ds := make([]time.Duration, len(ns))
		for i, n := range ns {
			ds[i] = time.Duration(n)
		}
		return int64(Summarize(ds).Med)
	}
	full, incr := med(r.FullBytes), med(r.IncrBytes)
	m.header("dump", "pages file", "of the full", "dump time", "frozen")
	m.row("full", units.FormatSize(uint64(full)), "100%", Summarize(r.FullDump).String(), Summarize(r.FullFrozen).String())
	m.row("incremental", units.FormatSize(uint64(incr)), fmt.Sprintf("%.2f%%", 100*float64(incr)/float64(full)), Summarize(r.IncrDump).String(), Summarize(r.IncrFrozen).String())
	if len(r.PreBytes) > 0 {
		pre := med(r.PreBytes)
		m.row("incremental, `--pre-copy`", units.FormatSize(uint64(pre)), fmt.Sprintf("%.2f%%", 100*float64(pre)/float64(full)), Summarize(r.PreDump).String(), Summarize(r.PreFrozen).String())
	}
	m.p("")
	m.p("Eager restore of the incremental snapshot (warm page cache, wall time): %s; %d/%d restored servers answered as before the dump.\n",
		Summarize(r.Restore), r.Restored, len(r.Restore))
}
