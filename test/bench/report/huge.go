package report

import (
	"fmt"
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
)

// HugeResult is the huge series.
type HugeResult struct {
	Size     uint64
	Arrays   int
	Init     time.Duration
	Image    uint64
	Dump     time.Duration
	Freeze   time.Duration
	Restores []*RestoreResult // one run each, HugeCases' order
}

// HugeCases are the series' restores.
func HugeCases() []RestoreCase {
	return []RestoreCase{
		{Mode: Eager, Threads: DefThreads, TokenFirst: true},
		{Mode: LazyMount, Threads: DefThreads, TokenFirst: true},
		{Mode: lazyDirect, Threads: DefThreads, TokenFirst: true},
	}
}

func validateHuge(_ int, sr *SizeResult, bad func(string, ...any)) {
	hr := sr.Huge
	if hr == nil {
		return
	}
	if len(hr.Restores) != len(HugeCases()) {
		bad("huge: %d restores, want %d", len(hr.Restores), len(HugeCases()))
		return
	}
	for _, r := range hr.Restores {
		if len(r.Runs) != 1 || r.Runs[0].Token <= 0 || r.Runs[0].Ping > r.Runs[0].Token {
			bad("huge %s: runs %+v", r.Case, r.Runs)
		}
	}
	if hr.Dump <= 0 {
		bad("huge: no dump figure")
	}
}

func renderHuge(m *md, sr *SizeResult) {
	hr := sr.Huge
	if hr == nil {
		return
	}
	m.p("### %s weightserver (`BENCH_HUGE=1`, one run)", units.FormatSize(hr.Size))
	m.p("")
	m.p("The weightserver of the weights section at %s, the size of a 4-billion-parameter model's checkpoint in bf16: %d arrays advised `MADV_HUGEPAGE` (fixture start-up %s), dumped with the default options (snapshot %s) and restored once each way, page cache warm as far as %s of process and %s of snapshot fit this machine's memory together. A client asks `ping`, then `token` (every weight read), from the start of the command.",
		units.FormatSize(hr.Size), hr.Arrays, hr.Init.Round(time.Millisecond), units.FormatSize(hr.Image), units.FormatSize(hr.Size), units.FormatSize(hr.Image))
	m.p("")
	m.header("", "dump (frozen)", "process runs", "ping", "token", "all memory in", "token / eager")
	eager := hr.Restores[0].Runs[0].Token
	one := func(d time.Duration) string { return Summarize([]time.Duration{d}).String() }
	for i, r := range hr.Restores {
		run := r.Runs[0]
		dump := "—"
		if i == 0 {
			dump = fmt.Sprintf("%s (%s)", one(hr.Dump), one(hr.Freeze))
		}
		m.row(r.Case.Label(), dump, one(run.Running), one(run.Ping), one(run.Token), one(run.Total),
			fmt.Sprintf("%.2f×", float64(run.Token)/float64(eager)))
	}
	m.p("")
}
