package main

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/lazyfs/lazyfs/test/bench/harness"
	"github.com/lazyfs/lazyfs/test/bench/measure"
	"github.com/lazyfs/lazyfs/test/bench/report"
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
	harness.ExtraSeries = append(harness.ExtraSeries, harness.Series{Name: "huge", Measure: measureHuge})
}

func measureHuge(ctx context.Context, h *harness.Harness, sr *report.SizeResult) error {
	if !(h.Huge || slices.Contains(h.Only, "huge")) || !h.First {
		return nil
	}
	size := h.Size
	h.Size = hugeSize // the fixture's size, and the commands' timeouts
	defer func() { h.Size = size }()
	hr := &report.HugeResult{Size: hugeSize}
	w := &report.WeightsResult{Advice: "hugepage"}
	snap, exp, err := h.DumpWeights(ctx, w, report.DefaultConfig())
	if err != nil {
		return err
	}
	defer os.RemoveAll(snap.Dir)
	hr.Arrays, hr.Init = w.Arrays, w.Init
	if hr.Image, err = measure.DirSize(snap.Dir); err != nil {
		return err
	}
	hr.Dump, hr.Freeze = h.WeightsDump.Total, h.WeightsDump.Freeze
	files, err := measure.SnapshotFiles(snap.Dir)
	if err != nil {
		return err
	}
	h.Expect = exp
	defer func() { h.Expect = harness.Expectation{} }()
	for _, c := range report.HugeCases() {
		run, err := h.RestoreOnce(ctx, snap, files, c)
		if err != nil {
			return fmt.Errorf("%s: %w", c, err)
		}
		hr.Restores = append(hr.Restores, &report.RestoreResult{Config: report.DefaultConfig(), Case: c, Runs: []report.RestoreRun{run}})
		h.Logf("huge %-24s: runs %s, ping %s, token %s, all in %s", c.Label(), harness.Millis(run.Running), harness.Millis(run.Ping), harness.Millis(run.Token), harness.Millis(run.Total))
	}
	sr.Huge = hr
	return nil
}
