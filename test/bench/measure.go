package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
	"github.com/lazyfs/lazyfs/test/bench/measure"
	"github.com/lazyfs/lazyfs/test/bench/report"
)

// harness is the state of one measuring run.
type harness struct {
	tools   measure.Tools
	work    string // snapshots, logs and the raw memory file
	runs    int
	log     io.Writer
	logPath string // the modelserver log (restored servers write to it too)
	size    uint64
	live    int // pid of the server alive now (original or restored), 0 if none
	started time.Time
	expect  expectation
	smaps   bool     // restoreOnce records the restored process's huge pages
	only    []string // -only: the series to run; empty: all
	smoke   bool     // a smoke run: series may measure less
	// restoreArgs are appended to every restore's arguments (the s3
	// series' --cache-dir).
	restoreArgs []string
	// first: the first size measured (the torch and huge series run
	// there only); huge: -huge.
	first, huge bool
	// weightsDump is what the last dumpWeights's snapctl dump reported.
	weightsDump measure.DumpReport
}

// expectation is what the original server answered; every restored server
// must answer the same.
type expectation struct {
	Touch1, Token, Heap string
}

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
		h := &harness{tools: t, work: work, runs: o.Runs, only: o.Only, log: o.Log, logPath: filepath.Join(work, "modelserver.log"), size: size, started: time.Now(), smoke: o.Smoke,
			first: i == 0, huge: o.Huge}
		sr, err := h.measureSize(ctx, o.Now)
		h.killLive()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", units.FormatSize(size), err)
		}
		rep.Sizes = append(rep.Sizes, sr)
	}
	rep.Elapsed = o.Now().Sub(rep.Started)
	rep.Machine.LoadAfter = measure.LoadAverage()
	return rep, nil
}

// killLive kills the server left alive by an error, if any.
func (h *harness) killLive() {
	if h.live == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := measure.KillAndReap(ctx, h.live); err != nil {
		fmt.Fprintf(h.log, "bench: %v\n", err)
	}
	h.live = 0
}

// opTimeout bounds one dump, restore or baseline command: generous, so that
// only a hang trips it.
func (h *harness) opTimeout() time.Duration {
	return 60*time.Second + time.Duration(h.size>>30)*30*time.Second
}

// logf prints one progress line.
func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.log, "bench: %6s [%s] %s\n", time.Since(h.started).Round(time.Second), units.FormatSize(h.size), fmt.Sprintf(format, args...))
}

// measureSize runs the dump, restore and baseline series of one size.
func (h *harness) measureSize(ctx context.Context, now func() time.Time) (*report.SizeResult, error) {
	start := now()
	sr := &report.SizeResult{Size: h.size}
	var raw string
	defer func() {
		if raw != "" {
			os.Remove(raw)
		}
	}()
	dumps := map[string]*report.DumpResult{}
	cfgs := report.MeasureOrder(report.DumpConfigs())
	if !h.wants("modelserver") {
		cfgs = nil
	}
	for _, cfg := range cfgs {
		snap, dr, err := h.dumpSeries(ctx, sr, cfg)
		if err != nil {
			return nil, fmt.Errorf("dump %s: %w", cfg.Name, err)
		}
		dumps[cfg.Short] = dr
		rs, err := h.restoreSeries(ctx, snap, cfg)
		if err != nil {
			os.RemoveAll(snap.Dir)
			return nil, fmt.Errorf("restore %s: %w", cfg.Name, err)
		}
		sr.Restores = append(sr.Restores, rs...)
		if raw == "" {
			if raw, sr.Memory, err = h.rawMemory(ctx, snap); err != nil {
				os.RemoveAll(snap.Dir)
				return nil, fmt.Errorf("raw memory for the lz4 baseline: %w", err)
			}
		}
		bs, err := h.baselines(ctx, snap, cfg, raw, sr.Memory, dr)
		os.RemoveAll(snap.Dir)
		if err != nil {
			return nil, fmt.Errorf("baselines %s: %w", cfg.Name, err)
		}
		sr.Baselines = append(sr.Baselines, bs...)
	}
	for _, cfg := range report.DumpConfigs() {
		if d := dumps[cfg.Short]; d != nil {
			sr.Dumps = append(sr.Dumps, d)
		}
	}
	if h.wants("weights") {
		ws, err := h.weightsSeries(ctx)
		if err != nil {
			return nil, err
		}
		sr.Weights = ws
	}
	for _, s := range extraSeries {
		if !h.wants(s.Name) {
			continue
		}
		if err := s.Measure(ctx, h, sr); err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
	}
	sr.Elapsed = now().Sub(start)
	h.logf("done in %s", sr.Elapsed.Round(time.Second))
	return sr, nil
}

// snapshot is the kept dump of a configuration.
type snapshot struct {
	Dir   string
	PID   int
	Port  int
	Pages string // the pages file
	// Workers are the other processes of a tree (the pre-fork server's
	// workers), with the pids they come back with.
	Workers []int
}

// killTree kills the restored processes of snap, the workers first, and
// reaps them (the harness is their subreaper).
func (snap *snapshot) killTree(ctx context.Context) error {
	for _, pid := range snap.Workers {
		if err := measure.KillAndReap(ctx, pid); err != nil {
			return err
		}
	}
	return measure.KillAndReap(ctx, snap.PID)
}

// taken reports whether a pid of snap is taken.
func (snap *snapshot) taken() (int, bool) {
	for _, pid := range append([]int{snap.PID}, snap.Workers...) {
		if measure.Alive(pid) {
			return pid, true
		}
	}
	return 0, false
}

// dumpSeries starts and dumps a server h.runs times; the last snapshot is
// kept for the restores.
func (h *harness) dumpSeries(ctx context.Context, sr *report.SizeResult, cfg report.DumpConfig) (*snapshot, *report.DumpResult, error) {
	dr := &report.DumpResult{Config: cfg}
	dir := filepath.Join(h.work, "snap-"+cfg.Short)
	var snap *snapshot
	for r := range h.runs {
		if err := os.RemoveAll(dir); err != nil {
			return nil, nil, err
		}
		s, err := h.dumpOnce(ctx, sr, cfg, dir, dr)
		if err != nil {
			return nil, nil, err
		}
		snap = s
		h.logf("dump %-12s run %d/%d: %s, frozen %s, image %s", cfg.Short, r+1, h.runs,
			dr.Wall[len(dr.Wall)-1].Round(time.Millisecond), dr.Freeze[len(dr.Freeze)-1], units.FormatSize(dr.Image))
	}
	return snap, dr, nil
}

// dumpOnce starts a server and dumps it into dir.
func (h *harness) dumpOnce(ctx context.Context, sr *report.SizeResult, cfg report.DumpConfig, dir string, dr *report.DumpResult) (*snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, h.opTimeout())
	defer cancel()
	srv, err := measure.StartServer(ctx, h.tools, h.tools.Modelserver, h.size, nil, h.logPath, h.work)
	if err != nil {
		return nil, err
	}
	h.live = srv.PID
	if ms, err := srv.Ready.Int("init_ms"); err == nil {
		sr.Init = append(sr.Init, time.Duration(ms)*time.Millisecond)
	}
	if h.expect == (expectation{}) {
		if err := h.learn(ctx, srv.Port); err != nil {
			return nil, err
		}
	}
	args := append([]string{"dump", "-t", strconv.Itoa(srv.PID), "-D", dir}, cfg.Args...)
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, h.tools.Snapctl, args...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = &out, &errOut, h.work
	start := time.Now()
	err = cmd.Run()
	wall := time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("snapctl %q: %w\n%s%s", args, err, out.String(), errOut.String())
	}
	if err := srv.WaitGone(ctx); err != nil {
		return nil, err
	}
	h.live = 0
	rep, err := measure.ParseDump(out.String())
	if err != nil {
		return nil, err
	}
	if rep.PID != srv.PID {
		return nil, fmt.Errorf("dump reported pid %d, want %d: %w", rep.PID, srv.PID, measure.ErrOutput)
	}
	dr.Wall = append(dr.Wall, wall)
	dr.Total = append(dr.Total, rep.Total)
	dr.Freeze = append(dr.Freeze, rep.Freeze)
	dr.Ratio = rep.Ratio
	pages := filepath.Join(dir, "pages-"+strconv.Itoa(srv.PID)+".img")
	if dr.Image, err = measure.DirSize(dir); err != nil {
		return nil, err
	}
	st, err := os.Stat(pages)
	if err != nil {
		return nil, fmt.Errorf("pages file: %w", err)
	}
	dr.Pages = uint64(st.Size())
	return &snapshot{Dir: dir, PID: srv.PID, Port: srv.Port, Pages: pages}, nil
}

// learn asks the original server the questions restored ones must answer
// alike.
func (h *harness) learn(ctx context.Context, port int) error {
	as, err := measure.Converse(ctx, port, time.Now(), "touch 1", "token")
	if err != nil {
		return fmt.Errorf("original server: %w", err)
	}
	h.expect = expectation{Touch1: as[0].Line.Fields["checksum"], Token: as[1].Line.Fields["checksum"], Heap: as[1].Line.Fields["heap"]}
	if h.expect.Touch1 == "" || h.expect.Token == "" || h.expect.Heap == "" {
		return fmt.Errorf("original server answered %q and %q: %w", as[0].Line.Text, as[1].Line.Text, measure.ErrOutput)
	}
	return nil
}

// check verifies a restored server's answers against the original's.
func (h *harness) check(as []measure.Answer) error {
	for _, a := range as {
		l := a.Line
		ok := false
		switch l.Event {
		case "pong":
			ok = true
		case "touch":
			ok = l.Fields["checksum"] == h.expect.Touch1
		case "token":
			ok = l.Fields["checksum"] == h.expect.Token && l.Fields["heap"] == h.expect.Heap
		}
		if !ok {
			return fmt.Errorf("restored server answered %q; the original answered touch 1 checksum=%s, token checksum=%s heap=%s",
				l.Text, h.expect.Touch1, h.expect.Token, h.expect.Heap)
		}
	}
	return nil
}
