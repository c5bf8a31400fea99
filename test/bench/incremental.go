package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/units"
)

// The "incremental" series: the modelserver dumped whole
// (--leave-running), then made to write 1% of its memory a second
// (`dirty 1`) for about a second, then dumped again against the first
// snapshot (--parent), first with --pre-copy --leave-running, then
// plainly, which kills it; the plain incremental snapshot is restored
// eagerly and must answer `touch 1` and `token` as the server did right
// before the second dump.
func init() {
	extraSeries = append(extraSeries, series{Name: "incremental", Measure: func(ctx context.Context, h *harness, sr *sizeResult) error { return h.incrementalSeries(ctx, sr) }})
}

// incrResult are the figures of the series, one entry per run.
type incrResult struct {
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

// incrDirtyTime is how long the server writes 1% of its memory a second
// between the two dumps.
const incrDirtyTime = time.Second

func (h *harness) incrementalSeries(ctx context.Context, sr *sizeResult) error {
	res := &incrResult{Dirtied: incrDirtyTime}
	for r := range h.runs {
		if err := h.incrementalOnce(ctx, res); err != nil {
			return err
		}
		h.logf("incremental run %d/%d: full %s in %s (frozen %s), incremental %s in %s (frozen %s, %.2f%%), with --pre-copy frozen %s, restore %s",
			r+1, h.runs, units.FormatSize(uint64(res.FullBytes[r])), ms(res.FullDump[r]), ms(res.FullFrozen[r]), units.FormatSize(uint64(res.IncrBytes[r])),
			ms(res.IncrDump[r]), ms(res.IncrFrozen[r]), 100*float64(res.IncrBytes[r])/float64(res.FullBytes[r]), ms(res.PreFrozen[r]), ms(res.Restore[r]))
	}
	sr.Incremental = res
	return nil
}

// pagesFileBytes returns the size of the pages file of pid in the
// snapshot at dir, as its manifest records it.
func pagesFileBytes(dir string, pid int) (int64, error) {
	b, err := os.ReadFile(filepath.Join(dir, image.ManifestName))
	if err != nil {
		return 0, err
	}
	var m image.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return 0, err
	}
	e, ok := m.Process(pid)
	if !ok {
		return 0, fmt.Errorf("%s: no process %d", dir, pid)
	}
	return m.Files[e.Pages].Size, nil
}

func (h *harness) incrementalOnce(ctx context.Context, res *incrResult) error {
	ctx, cancel := context.WithTimeout(ctx, 6*h.opTimeout())
	defer cancel()
	srv, err := startServer(ctx, h.tools, h.tools.Modelserver, h.size, nil, h.logPath, h.work)
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
	dump := func(dir string, args ...string) (dumpReport, int64, error) {
		if err := evict(parentPages); err != nil {
			return dumpReport{}, 0, err
		}
		out, err := h.snapctl(ctx, append([]string{"dump", "-t", strconv.Itoa(srv.PID), "-D", dir}, args...)...)
		if err != nil {
			return dumpReport{}, 0, err
		}
		d, err := parseDump(out)
		if err != nil {
			return d, 0, err
		}
		n, err := pagesFileBytes(dir, srv.PID)
		return d, n, err
	}
	d, n, err := dump(full, "--leave-running")
	if err != nil {
		return err
	}
	res.FullBytes, res.FullDump, res.FullFrozen = append(res.FullBytes, n), append(res.FullDump, d.Total), append(res.FullFrozen, d.Freeze)

	if _, err := converse(ctx, srv.Port, time.Now(), "dirty 1"); err != nil {
		return err
	}
	time.Sleep(incrDirtyTime)
	if _, err := converse(ctx, srv.Port, time.Now(), "dirty 0"); err != nil {
		return err
	}
	// What the restored server must answer: its memory now.
	as, err := converse(ctx, srv.Port, time.Now(), "touch 1", "token")
	if err != nil {
		return err
	}
	want := expectation{Touch1: as[0].Line.Fields["checksum"], Token: as[1].Line.Fields["checksum"], Heap: as[1].Line.Fields["heap"]}

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
	if err := killAndReap(ctx, srv.PID); err != nil { // the dump killed it: reap it
		return err
	}
	h.live = 0

	saved := h.expect
	h.expect = want
	defer func() { h.expect = saved }()
	run, err := h.restoreOnce(ctx, &snapshot{Dir: incr, PID: srv.PID, Port: srv.Port}, nil, restoreCase{Mode: eager, Threads: defThreads})
	if err != nil {
		return fmt.Errorf("restore of the incremental snapshot: %w", err)
	}
	res.Restore = append(res.Restore, run.Wall)
	res.Restored++
	return nil
}

// evict drops the cached pages of the file at path, if it exists.
func evict(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

func validateIncremental(runs int, sr *sizeResult, bad func(string, ...any)) {
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

func renderIncremental(m *md, sr *sizeResult) {
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
		return int64(summarize(ds).Med)
	}
	full, incr := med(r.FullBytes), med(r.IncrBytes)
	m.header("dump", "pages file", "of the full", "dump time", "frozen")
	m.row("full", units.FormatSize(uint64(full)), "100%", summarize(r.FullDump).String(), summarize(r.FullFrozen).String())
	m.row("incremental", units.FormatSize(uint64(incr)), fmt.Sprintf("%.2f%%", 100*float64(incr)/float64(full)), summarize(r.IncrDump).String(), summarize(r.IncrFrozen).String())
	if len(r.PreBytes) > 0 {
		pre := med(r.PreBytes)
		m.row("incremental, `--pre-copy`", units.FormatSize(uint64(pre)), fmt.Sprintf("%.2f%%", 100*float64(pre)/float64(full)), summarize(r.PreDump).String(), summarize(r.PreFrozen).String())
	}
	m.p("")
	m.p("Eager restore of the incremental snapshot (warm page cache, wall time): %s; %d/%d restored servers answered as before the dump.\n",
		summarize(r.Restore), r.Restored, len(r.Restore))
}
