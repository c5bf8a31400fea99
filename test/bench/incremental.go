package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
	"github.com/lazyfs/lazyfs/test/bench/harness"
	"github.com/lazyfs/lazyfs/test/bench/measure"
	"github.com/lazyfs/lazyfs/test/bench/report"
)

// The "incremental" series: the modelserver dumped whole
// (--leave-running), then made to write 1% of its memory a second
// (`dirty 1`) for about a second, then dumped again against the first
// snapshot (--parent), first with --pre-copy --leave-running, then
// plainly, which kills it; the plain incremental snapshot is restored
// eagerly and must answer `touch 1` and `token` as the server did right
// before the second dump.
func init() {
	harness.ExtraSeries = append(harness.ExtraSeries, harness.Series{Name: "incremental", Measure: incrementalSeries})
}

// incrDirtyTime is how long the server writes 1% of its memory a second
// between the two dumps.
const incrDirtyTime = time.Second

func incrementalSeries(ctx context.Context, h *harness.Harness, sr *report.SizeResult) error {
	res := &report.IncrResult{Dirtied: incrDirtyTime}
	for r := range h.Runs {
		if err := incrementalOnce(ctx, h, res); err != nil {
			return err
		}
		h.Logf("incremental run %d/%d: full %s in %s (frozen %s), incremental %s in %s (frozen %s, %.2f%%), with --pre-copy frozen %s, restore %s",
			r+1, h.Runs, units.FormatSize(uint64(res.FullBytes[r])), harness.Millis(res.FullDump[r]), harness.Millis(res.FullFrozen[r]), units.FormatSize(uint64(res.IncrBytes[r])),
			harness.Millis(res.IncrDump[r]), harness.Millis(res.IncrFrozen[r]), 100*float64(res.IncrBytes[r])/float64(res.FullBytes[r]), harness.Millis(res.PreFrozen[r]), harness.Millis(res.Restore[r]))
	}
	sr.Incremental = res
	return nil
}

func incrementalOnce(ctx context.Context, h *harness.Harness, res *report.IncrResult) error {
	ctx, cancel := context.WithTimeout(ctx, 6*h.OpTimeout())
	defer cancel()
	srv, err := measure.StartServer(ctx, h.Tools, h.Tools.Modelserver, h.Size, nil, h.LogPath, h.Work)
	if err != nil {
		return err
	}
	h.Live = srv.PID
	defer h.KillLive()
	full, incr := filepath.Join(h.Work, "incr-full"), filepath.Join(h.Work, "incr-child")
	os.RemoveAll(full)
	os.RemoveAll(incr)
	defer os.RemoveAll(full)
	defer os.RemoveAll(incr)

	// Each incremental dump reads the parent's pages as if dumped long
	// ago: the full dump wrote them with O_DIRECT, and the first
	// incremental dump would otherwise leave them cached for the second.
	parentPages := filepath.Join(full, fmt.Sprintf("pages-%d.img", srv.PID))
	dump := func(dir string, args ...string) (measure.DumpReport, int64, error) {
		if err := measure.Evict(parentPages); err != nil {
			return measure.DumpReport{}, 0, err
		}
		out, err := h.Snapctl(ctx, append([]string{"dump", "-t", strconv.Itoa(srv.PID), "-D", dir}, args...)...)
		if err != nil {
			return measure.DumpReport{}, 0, err
		}
		d, err := measure.ParseDump(out)
		if err != nil {
			return d, 0, err
		}
		n, err := measure.PagesFileBytes(dir, srv.PID)
		return d, n, err
	}
	d, n, err := dump(full, "--leave-running")
	if err != nil {
		return err
	}
	res.FullBytes, res.FullDump, res.FullFrozen = append(res.FullBytes, n), append(res.FullDump, d.Total), append(res.FullFrozen, d.Freeze)

	want, err := dirty(ctx, srv.Port)
	if err != nil {
		return err
	}

	pre := filepath.Join(h.Work, "incr-precopy")
	os.RemoveAll(pre)
	defer os.RemoveAll(pre)
	d, n, err = dump(pre, "--parent", full, "--pre-copy", "--leave-running")
	if err != nil {
		return err
	}
	res.PreBytes, res.PreDump, res.PreFrozen = append(res.PreBytes, n), append(res.PreDump, d.Total), append(res.PreFrozen, d.Freeze)

	d, n, err = dump(incr, "--parent", full)
	if err != nil {
		return err
	}
	res.IncrBytes, res.IncrDump, res.IncrFrozen = append(res.IncrBytes, n), append(res.IncrDump, d.Total), append(res.IncrFrozen, d.Freeze)
	if err := measure.KillAndReap(ctx, srv.PID); err != nil { // the dump killed it: reap it
		return err
	}
	h.Live = 0

	saved := h.Expect
	h.Expect = want
	defer func() { h.Expect = saved }()
	run, err := h.RestoreOnce(ctx, &harness.Snapshot{Dir: incr, PID: srv.PID, Port: srv.Port}, nil, report.RestoreCase{Mode: report.Eager, Threads: report.DefThreads})
	if err != nil {
		return fmt.Errorf("restore of the incremental snapshot: %w", err)
	}
	res.Restore = append(res.Restore, run.Wall)
	res.Restored++
	return nil
}

// dirty has the server on port write its memory for incrDirtyTime, and
// returns what a restore of it must answer from then on.
func dirty(ctx context.Context, port int) (harness.Expectation, error) {
	if _, err := measure.Converse(ctx, port, time.Now(), "dirty 1"); err != nil {
		return harness.Expectation{}, err
	}
	time.Sleep(incrDirtyTime)
	if _, err := measure.Converse(ctx, port, time.Now(), "dirty 0"); err != nil {
		return harness.Expectation{}, err
	}
	// What the restored server must answer: its memory now.
	as, err := measure.Converse(ctx, port, time.Now(), "touch 1", "token")
	if err != nil {
		return harness.Expectation{}, err
	}
	return harness.Expectation{Touch1: as[0].Line.Fields["checksum"], Token: as[1].Line.Fields["checksum"], Heap: as[1].Line.Fields["heap"]}, nil
}
