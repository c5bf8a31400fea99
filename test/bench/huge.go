package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
)

// The "huge" series (-huge, BENCH_HUGE=1, or -only huge): the weightserver at 12 GiB, the
// size of a 4-billion-parameter model's checkpoint in bf16 (or 3 billion
// in float32), dumped once and restored once each way: eagerly, lazily
// through the private mount and lazily direct, a client asking ping then
// token (every weight read). One run: its figures are minutes of the
// machine's time, and its memory (the process, then its snapshot in the
// page cache) is most of this machine's. Warm means read once before the
// command; with 12 GiB of process beside 12 GiB of snapshot on a 24 GiB
// machine, part of the snapshot is read from the disk again anyway.

// hugeSize is the weightserver's memory in the series.
const hugeSize = 12 << 30

// HugeEnv set to 1 runs the huge series, like -huge.
const HugeEnv = "BENCH_HUGE"

func init() {
	extraSeries = append(extraSeries, series{Name: "huge", Measure: measureHuge})
}

// hugeResult is the huge series.
type hugeResult struct {
	Size     uint64
	Arrays   int
	Init     time.Duration
	Image    uint64
	Dump     time.Duration
	Freeze   time.Duration
	Restores []*restoreResult // one run each, hugeCases' order
}

// hugeCases are the series' restores.
func hugeCases() []restoreCase {
	return []restoreCase{
		{Mode: eager, Threads: defThreads, TokenFirst: true},
		{Mode: lazyMount, Threads: defThreads, TokenFirst: true},
		{Mode: lazyDirect, Threads: defThreads, TokenFirst: true},
	}
}

func measureHuge(ctx context.Context, h *harness, sr *sizeResult) error {
	if !(h.huge || slices.Contains(h.only, "huge")) || !h.first {
		return nil
	}
	size := h.size
	h.size = hugeSize // the fixture's size, and the commands' timeouts
	defer func() { h.size = size }()
	hr := &hugeResult{Size: hugeSize}
	w := &weightsResult{Advice: "hugepage"}
	snap, exp, err := h.dumpWeights(ctx, w, defaultConfig())
	if err != nil {
		return err
	}
	defer os.RemoveAll(snap.Dir)
	hr.Arrays, hr.Init = w.Arrays, w.Init
	if hr.Image, err = dirSize(snap.Dir); err != nil {
		return err
	}
	hr.Dump, hr.Freeze = h.weightsDump.Total, h.weightsDump.Freeze
	files, err := snapshotFiles(snap.Dir)
	if err != nil {
		return err
	}
	h.expect = exp
	defer func() { h.expect = expectation{} }()
	for _, c := range hugeCases() {
		run, err := h.restoreOnce(ctx, snap, files, c)
		if err != nil {
			return fmt.Errorf("%s: %w", c, err)
		}
		hr.Restores = append(hr.Restores, &restoreResult{Config: defaultConfig(), Case: c, Runs: []restoreRun{run}})
		h.logf("huge %-24s: runs %s, ping %s, token %s, all in %s", c.Label(), ms(run.Running), ms(run.Ping), ms(run.Token), ms(run.Total))
	}
	sr.Huge = hr
	return nil
}

func validateHuge(_ int, sr *sizeResult, bad func(string, ...any)) {
	hr := sr.Huge
	if hr == nil {
		return
	}
	if len(hr.Restores) != len(hugeCases()) {
		bad("huge: %d restores, want %d", len(hr.Restores), len(hugeCases()))
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

func renderHuge(m *md, sr *sizeResult) {
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
	one := func(d time.Duration) string { return summarize([]time.Duration{d}).String() }
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
