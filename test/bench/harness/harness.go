package harness

import (
	"bytes"
	"context"
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

// Harness is the state of one measuring run.
type Harness struct {
	Tools   measure.Tools
	Work    string // snapshots, logs and the raw memory file
	Runs    int
	Log     io.Writer
	LogPath string // the modelserver log (restored servers write to it too)
	Size    uint64
	Live    int // pid of the server alive now (original or restored), 0 if none
	Started time.Time
	Expect  Expectation
	smaps   bool     // RestoreOnce records the restored process's huge pages
	Only    []string // -only: the series to run; empty: all
	Smoke   bool     // a smoke run: series may measure less
	// RestoreArgs are appended to every restore's arguments (the s3
	// series' --cache-dir).
	RestoreArgs []string
	// First: the first size measured (the torch and huge series run
	// there only); Huge: -huge.
	First, Huge bool
	// WeightsDump is what the last DumpWeights's snapctl dump reported.
	WeightsDump measure.DumpReport
}

// Expectation is what the original server answered; every restored server
// must answer the same.
type Expectation struct {
	Touch1, Token, Heap string
}

// KillLive kills the server left alive by an error, if any.
func (h *Harness) KillLive() {
	if h.Live == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := measure.KillAndReap(ctx, h.Live); err != nil {
		fmt.Fprintf(h.Log, "bench: %v\n", err)
	}
	h.Live = 0
}

// OpTimeout bounds one dump, restore or baseline command: generous, so that
// only a hang trips it.
func (h *Harness) OpTimeout() time.Duration {
	return 60*time.Second + time.Duration(h.Size>>30)*30*time.Second
}

// Logf prints one progress line.
func (h *Harness) Logf(format string, args ...any) {
	fmt.Fprintf(h.Log, "bench: %6s [%s] %s\n", time.Since(h.Started).Round(time.Second), units.FormatSize(h.Size), fmt.Sprintf(format, args...))
}

// MeasureSize runs the dump, restore and baseline series of one size.
func (h *Harness) MeasureSize(ctx context.Context, now func() time.Time) (*report.SizeResult, error) {
	start := now()
	sr := &report.SizeResult{Size: h.Size}
	var raw string
	defer func() {
		if raw != "" {
			os.Remove(raw)
		}
	}()
	dumps := map[string]*report.DumpResult{}
	cfgs := report.MeasureOrder(report.DumpConfigs())
	if !h.Wants("modelserver") {
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
	if h.Wants("weights") {
		ws, err := h.weightsSeries(ctx)
		if err != nil {
			return nil, err
		}
		sr.Weights = ws
	}
	for _, s := range ExtraSeries {
		if !h.Wants(s.Name) {
			continue
		}
		if err := s.Measure(ctx, h, sr); err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
	}
	sr.Elapsed = now().Sub(start)
	h.Logf("done in %s", sr.Elapsed.Round(time.Second))
	return sr, nil
}

// Snapshot is the kept dump of a configuration.
type Snapshot struct {
	Dir   string
	PID   int
	Port  int
	Pages string // the pages file
	// Workers are the other processes of a tree (the pre-fork server's
	// workers), with the pids they come back with.
	Workers []int
}

// KillTree kills the restored processes of snap, the workers first, and
// reaps them (the harness is their subreaper).
func (snap *Snapshot) KillTree(ctx context.Context) error {
	for _, pid := range snap.Workers {
		if err := measure.KillAndReap(ctx, pid); err != nil {
			return err
		}
	}
	return measure.KillAndReap(ctx, snap.PID)
}

// Taken reports whether a pid of snap is taken.
func (snap *Snapshot) Taken() (int, bool) {
	for _, pid := range append([]int{snap.PID}, snap.Workers...) {
		if measure.Alive(pid) {
			return pid, true
		}
	}
	return 0, false
}

// dumpSeries starts and dumps a server h.Runs times; the last snapshot is
// kept for the restores.
func (h *Harness) dumpSeries(ctx context.Context, sr *report.SizeResult, cfg report.DumpConfig) (*Snapshot, *report.DumpResult, error) {
	dr := &report.DumpResult{Config: cfg}
	dir := filepath.Join(h.Work, "snap-"+cfg.Short)
	var snap *Snapshot
	for r := range h.Runs {
		if err := os.RemoveAll(dir); err != nil {
			return nil, nil, err
		}
		s, err := h.DumpOnce(ctx, sr, cfg, dir, dr)
		if err != nil {
			return nil, nil, err
		}
		snap = s
		h.Logf("dump %-12s run %d/%d: %s, frozen %s, image %s", cfg.Short, r+1, h.Runs,
			dr.Wall[len(dr.Wall)-1].Round(time.Millisecond), dr.Freeze[len(dr.Freeze)-1], units.FormatSize(dr.Image))
	}
	return snap, dr, nil
}

// DumpOnce starts a server and dumps it into dir.
func (h *Harness) DumpOnce(ctx context.Context, sr *report.SizeResult, cfg report.DumpConfig, dir string, dr *report.DumpResult) (*Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, h.OpTimeout())
	defer cancel()
	srv, err := measure.StartServer(ctx, h.Tools, h.Tools.Modelserver, h.Size, nil, h.LogPath, h.Work)
	if err != nil {
		return nil, err
	}
	h.Live = srv.PID
	if ms, err := srv.Ready.Int("init_ms"); err == nil {
		sr.Init = append(sr.Init, time.Duration(ms)*time.Millisecond)
	}
	if h.Expect == (Expectation{}) {
		if err := h.Learn(ctx, srv.Port); err != nil {
			return nil, err
		}
	}
	args := append([]string{"dump", "-t", strconv.Itoa(srv.PID), "-D", dir}, cfg.Args...)
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, h.Tools.Snapctl, args...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = &out, &errOut, h.Work
	start := time.Now()
	err = cmd.Run()
	wall := time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("snapctl %q: %w\n%s%s", args, err, out.String(), errOut.String())
	}
	if err := srv.WaitGone(ctx); err != nil {
		return nil, err
	}
	h.Live = 0
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
	return &Snapshot{Dir: dir, PID: srv.PID, Port: srv.Port, Pages: pages}, nil
}

// Learn asks the original server the questions restored ones must answer
// alike.
func (h *Harness) Learn(ctx context.Context, port int) error {
	as, err := measure.Converse(ctx, port, time.Now(), "touch 1", "token")
	if err != nil {
		return fmt.Errorf("original server: %w", err)
	}
	h.Expect = Expectation{Touch1: as[0].Line.Fields["checksum"], Token: as[1].Line.Fields["checksum"], Heap: as[1].Line.Fields["heap"]}
	if h.Expect.Touch1 == "" || h.Expect.Token == "" || h.Expect.Heap == "" {
		return fmt.Errorf("original server answered %q and %q: %w", as[0].Line.Text, as[1].Line.Text, measure.ErrOutput)
	}
	return nil
}

// Check verifies a restored server's answers against the original's.
func (h *Harness) Check(as []measure.Answer) error {
	for _, a := range as {
		l := a.Line
		ok := false
		switch l.Event {
		case "pong":
			ok = true
		case "touch":
			ok = l.Fields["checksum"] == h.Expect.Touch1
		case "token":
			ok = l.Fields["checksum"] == h.Expect.Token && l.Fields["heap"] == h.Expect.Heap
		}
		if !ok {
			return fmt.Errorf("restored server answered %q; the original answered touch 1 checksum=%s, token checksum=%s heap=%s",
				l.Text, h.Expect.Touch1, h.Expect.Token, h.Expect.Heap)
		}
	}
	return nil
}
