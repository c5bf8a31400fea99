package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
	"github.com/lazyfs/lazyfs/test/bench/harness"
	"github.com/lazyfs/lazyfs/test/bench/measure"
	"github.com/lazyfs/lazyfs/test/bench/report"
)

// measureAll runs every measurement of o.
func measureAll(ctx context.Context, o options) (*report.Report, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("run as root: dump and restore trace processes and cold runs drop the page cache")
	}
	if err := measure.BecomeSubreaper(); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(o.Work, "lazyfs-bench-")
	if err != nil {
		return nil, fmt.Errorf("work directory: %w", err)
	}
	defer os.RemoveAll(work)
	fmt.Fprintf(o.Log, "bench: building tools into %s\n", work)
	t, err := measure.BuildTools(ctx, o.Bin, work)
	if err != nil {
		return nil, err
	}
	rep := &report.Report{Runs: o.Runs, Smoke: o.Smoke, Only: o.Only, Started: o.Now()}
	rep.Machine = measure.DescribeMachine(work, t)
	for i, size := range o.Sizes {
		h := &harness.Harness{Tools: t, Work: work, Runs: o.Runs, Only: o.Only, Log: o.Log, LogPath: filepath.Join(work, "modelserver.log"), Size: size, Started: time.Now(), Smoke: o.Smoke,
			First: i == 0, Huge: o.Huge}
		sr, err := h.MeasureSize(ctx, o.Now)
		h.KillLive()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", units.FormatSize(size), err)
		}
		rep.Sizes = append(rep.Sizes, sr)
	}
	rep.Elapsed = o.Now().Sub(rep.Started)
	rep.Machine.LoadAfter = measure.LoadAverage()
	return rep, nil
}
