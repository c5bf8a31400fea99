package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
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
	extraSeries = append(extraSeries, series{Name: "incremental", Measure: incrementalSeries})
}

// incrDirtyTime is how long the server writes 1% of its memory a second
// between the two dumps.
const incrDirtyTime = time.Second

func incrementalSeries(ctx context.Context, h *harness, sr *report.SizeResult) error {
	res := &report.IncrResult{Dirtied: incrDirtyTime}
	for r := range h.runs {
		if err := incrementalOnce(ctx, h, res); err != nil {
			return err
		}
		h.logf("incremental run %d/%d: full %s in %s (frozen %s), incremental %s in %s (frozen %s, %.2f%%), with --pre-copy frozen %s, restore %s",
			r+1, h.runs, units.FormatSize(uint64(res.FullBytes[r])), ms(res.FullDump[r]), ms(res.FullFrozen[r]), units.FormatSize(uint64(res.IncrBytes[r])),
			ms(res.IncrDump[r]), ms(res.IncrFrozen[r]), 100*float64(res.IncrBytes[r])/float64(res.FullBytes[r]), ms(res.PreFrozen[r]), ms(res.Restore[r]))
	}
	sr.Incremental = res
	return nil
}

func incrementalOnce(ctx context.Context, h *harness, res *report.IncrResult) error {
	ctx, cancel := context.WithTimeout(ctx, 6*h.opTimeout())
	defer cancel()
	srv, err := measure.StartServer(ctx, h.tools, h.tools.Modelserver, h.size, nil, h.logPath, h.work)
	if err != nil {
		return err
	}
	h.live = srv.PID
	defer h.killLive()
	full, incr := filepath.Join(h.work, "incr-full"), filepath.Join(h.work, "incr-child")
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
		out, err := h.snapctl(ctx, append([]string{"dump", "-t", strconv.Itoa(srv.PID), "-D", dir}, args...)...)
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

	pre := filepath.Join(h.work, "incr-precopy")
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
	h.live = 0

	saved := h.expect
	h.expect = want
	defer func() { h.expect = saved }()
	run, err := h.restoreOnce(ctx, &snapshot{Dir: incr, PID: srv.PID, Port: srv.Port}, nil, report.RestoreCase{Mode: report.Eager, Threads: report.DefThreads})
	if err != nil {
		return fmt.Errorf("restore of the incremental snapshot: %w", err)
	}
	res.Restore = append(res.Restore, run.Wall)
	res.Restored++
	return nil
}

// dirty has the server on port write its memory for incrDirtyTime, and
// returns what a restore of it must answer from then on.
func dirty(ctx context.Context, port int) (expectation, error) {
	if _, err := measure.Converse(ctx, port, time.Now(), "dirty 1"); err != nil {
		return expectation{}, err
	}
	time.Sleep(incrDirtyTime)
	if _, err := measure.Converse(ctx, port, time.Now(), "dirty 0"); err != nil {
		return expectation{}, err
	}
	// What the restored server must answer: its memory now.
	as, err := measure.Converse(ctx, port, time.Now(), "touch 1", "token")
	if err != nil {
		return expectation{}, err
	}
	return expectation{Touch1: as[0].Line.Fields["checksum"], Token: as[1].Line.Fields["checksum"], Heap: as[1].Line.Fields["heap"]}, nil
}
