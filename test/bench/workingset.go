package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lazyfs/lazyfs/test/bench/harness"
	"github.com/lazyfs/lazyfs/test/bench/measure"
	"github.com/lazyfs/lazyfs/test/bench/report"
)

// The working-set series: a snapshot restored lazily with a working set
// recorded on an earlier lazy restore of it (snapctl restore
// --record-working-set, stopped by SIGUSR1 once "touch 1" was answered),
// against the same without (--working-set off) and an eager restore, cold
// and warm; and a "token" request, which the working set does not cover.
// For the modelserver and the weightserver (numpy's layout); and, warm
// only, for a process tree: the modelserver as a pre-fork server (a
// parent and 2 workers, a working set per process), at most 256 MiB.

func init() {
	harness.ExtraSeries = append(harness.ExtraSeries, harness.Series{Name: "workingset", Measure: workingSetSeries})
}

// wsTreeCases are the restores of the process tree, warm only.
func wsTreeCases() []report.WSCase {
	return []report.WSCase{{Mode: report.WSEager}, {Mode: report.WSOff}, {Mode: report.WSCopy}}
}

// wsCases are the restores of each server, in the order of a round.
func wsCases() []report.WSCase {
	var cs []report.WSCase
	for _, cold := range []bool{false, true} {
		for _, m := range []string{report.WSEager, report.WSOff, report.WSCopy, report.WSBlocks} {
			cs = append(cs, report.WSCase{Mode: m, Cold: cold})
		}
		for _, m := range []string{report.WSOff, report.WSCopy} {
			cs = append(cs, report.WSCase{Mode: m, Cold: cold, Token: true})
		}
	}
	return cs
}

// workingSetSeries measures both servers.
func workingSetSeries(ctx context.Context, h *harness.Harness, sr *report.SizeResult) error {
	for _, srv := range []struct {
		name, prog string
		extra      []string
		size       uint64
		cases      []report.WSCase
	}{
		{"modelserver", h.Tools.Modelserver, nil, h.Size, wsCases()},
		{"weightserver", h.Tools.Weights, []string{"42", "hugepage"}, h.Size, wsCases()},
		{"modelserver pre-fork", h.Tools.Modelserver, []string{"42", "2"}, min(h.Size, 256<<20), wsTreeCases()},
	} {
		w, err := workingSetServer(ctx, h, srv.name, srv.prog, srv.extra, srv.size, srv.cases)
		if err != nil {
			return fmt.Errorf("working set, %s: %w", srv.name, err)
		}
		sr.WorkingSet = append(sr.WorkingSet, w)
	}
	h.Expect = harness.Expectation{}
	return nil
}

// workingSetServer dumps one server, records its working set and runs
// the cases h.Runs times, interleaved.
func workingSetServer(ctx context.Context, h *harness.Harness, name, prog string, extra []string, size uint64, cases []report.WSCase) (*report.WSResult, error) {
	w := &report.WSResult{Server: name}
	snap, err := wsDump(ctx, h, name, prog, extra, size)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(snap.Dir)
	if err := wsRecord(ctx, h, snap, w); err != nil {
		return nil, err
	}
	recorded := recordedAny(w.Recorded)
	if !recorded {
		// A pre-fork server's workers may fault in nothing for "touch 1"
		// (their memory shared with the parent comes before they run):
		// its working-set rows are then restores with nothing to fetch
		// first, not failures.
		h.Logf("workingset %s: every working set is empty: nothing to fetch first", name)
	}
	files, err := measure.SnapshotFiles(snap.Dir)
	if err != nil {
		return nil, err
	}
	for _, c := range cases {
		w.Cases = append(w.Cases, &report.WSCaseResult{Case: c})
	}
	for r := range h.Runs {
		for _, cr := range w.Cases {
			run, err := wsRestoreOnce(ctx, h, snap, files, cr.Case, recorded)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", cr.Case, err)
			}
			cr.Runs = append(cr.Runs, run)
			h.Logf("workingset %s %-40s run %d/%d: runs %s, ping %s, %s %s, exit %s",
				name, cr.Case.Mode+" "+cr.Case.Cache(), r+1, h.Runs, harness.Millis(run.Running), harness.Millis(run.Ping), cr.Case.Request(), harness.Millis(report.WSAnswer(cr.Case, run)), harness.Millis(run.Wall))
		}
	}
	return w, nil
}

// wsTimeout bounds one command of the series: the harness's bound, five
// times over, since the series runs after the others on a machine that
// may be shared (a server's start-up alone took over a minute at a load
// of 50 on two CPUs).
func wsTimeout(h *harness.Harness) time.Duration { return 5 * h.OpTimeout() }

// wsDump starts a server, learns its answers and dumps it with the
// default option.
func wsDump(ctx context.Context, h *harness.Harness, name, prog string, extra []string, size uint64) (*harness.Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, wsTimeout(h))
	defer cancel()
	srv, err := measure.StartServer(ctx, h.Tools, prog, size, extra, h.LogPath, h.Work)
	if err != nil {
		return nil, err
	}
	h.Live = srv.PID
	h.Expect = harness.Expectation{}
	if err := h.Learn(ctx, srv.Port); err != nil {
		return nil, err
	}
	var workers []int
	if ws, ok := srv.Ready.Fields["workers"]; ok {
		for _, f := range strings.Split(ws, ",") {
			pid, err := strconv.Atoi(f)
			if err != nil {
				return nil, fmt.Errorf("ready line %q: %w", srv.Ready.Text, measure.ErrOutput)
			}
			workers = append(workers, pid)
		}
	}
	dir := filepath.Join(h.Work, "snap-ws-"+strings.ReplaceAll(name, " ", "-"))
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	args := append([]string{"dump", "-t", strconv.Itoa(srv.PID), "-D", dir}, report.DefaultConfig().Args...)
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, h.Tools.Snapctl, args...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = &stdout, &stderr, h.Work
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("snapctl %q: %w\n%s%s", args, err, stdout.String(), stderr.String())
	}
	if err := srv.WaitGone(ctx); err != nil {
		return nil, err
	}
	snap := &harness.Snapshot{Dir: dir, PID: srv.PID, Port: srv.Port, Pages: filepath.Join(dir, "pages-"+strconv.Itoa(srv.PID)+".img"), Workers: workers}
	if err := snap.KillTree(ctx); err != nil { // the workers' zombies
		return nil, err
	}
	h.Live = 0
	h.Logf("workingset: dumped %s: %s", name, strings.TrimSpace(stdout.String()))
	return snap, nil
}

// wsRecord restores snap lazily recording its working set: "ping" and
// "touch 1" are asked, then snapctl is sent SIGUSR1.
func wsRecord(ctx context.Context, h *harness.Harness, snap *harness.Snapshot, w *report.WSResult) error {
	ctx, cancel := context.WithTimeout(ctx, wsTimeout(h))
	defer cancel()
	args := []string{"restore", "-D", snap.Dir, "--lazy", "--record-working-set", "--record-for", "5m"}
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, h.Tools.Snapctl, args...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = &out, &errOut, h.Work
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	h.Live = snap.PID
	answers, askErr := measure.Converse(ctx, snap.Port, start, "ping", "touch 1")
	if askErr == nil {
		askErr = h.Check(answers)
	}
	cmd.Process.Signal(syscall.SIGUSR1)
	err := cmd.Wait()
	if err != nil {
		return fmt.Errorf("snapctl %q: %w\n%s%s", args, err, out.String(), errOut.String())
	}
	if askErr != nil {
		return askErr
	}
	var recorded []string
	for line := range strings.Lines(out.String()) {
		if rest, ok := strings.CutPrefix(line, "working set recorded: "); ok {
			// Without its path: "SIZE in N ranges over D (stopped by S)".
			rest, _, _ = strings.Cut(strings.TrimSpace(rest), ") in ")
			recorded = append(recorded, rest+")")
		}
	}
	if len(recorded) != 1+len(snap.Workers) {
		return fmt.Errorf("%d working sets recorded, want %d: %q: %w", len(recorded), 1+len(snap.Workers), out.String(), measure.ErrOutput)
	}
	w.Recorded = strings.Join(recorded, "; ")
	for _, pid := range append([]int{snap.PID}, snap.Workers...) {
		st, err := os.Stat(filepath.Join(snap.Dir, "workingset-"+strconv.Itoa(pid)+".img"))
		if err != nil {
			return err
		}
		w.File += uint64(st.Size())
	}
	h.Logf("workingset: recorded in %s (touch 1 answered after %s): %s", time.Since(start).Round(time.Millisecond), answers[1].At.Round(time.Millisecond), w.Recorded)
	if err := snap.KillTree(ctx); err != nil {
		return err
	}
	h.Live = 0
	return nil
}

// recordedAny reports whether any of wsRecord's working sets (its
// "SIZE in N ranges over D (stopped by S)" joined by "; ") holds a page.
func recordedAny(recorded string) bool {
	for _, r := range strings.Split(recorded, "; ") {
		if !strings.HasPrefix(r, "0 B in 0 ranges") {
			return true
		}
	}
	return false
}

// wsRestoreOnce restores snap as c says, times the answers, checks them
// (and, if recorded says a working set holds a page, that a working-set
// case used it), then kills the restored server.
func wsRestoreOnce(ctx context.Context, h *harness.Harness, snap *harness.Snapshot, files []string, c report.WSCase, recorded bool) (report.RestoreRun, error) {
	var run report.RestoreRun
	ctx, cancel := context.WithTimeout(ctx, wsTimeout(h))
	defer cancel()
	if pid, taken := snap.Taken(); taken {
		return run, fmt.Errorf("pid %d is taken before the restore", pid)
	}
	if err := measure.SetCache(c.Cold, files...); err != nil {
		return run, err
	}
	args := c.Args(snap.Dir)
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, h.Tools.Snapctl, args...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = &out, &errOut, h.Work
	askCtx, stopAsking := context.WithCancel(ctx)
	defer stopAsking()
	exited := make(chan error, 1)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return run, fmt.Errorf("start snapctl: %w", err)
	}
	h.Live = snap.PID
	var wall time.Duration
	go func() {
		err := cmd.Wait()
		wall = time.Since(start)
		exited <- err
		if err != nil {
			stopAsking()
		}
	}()
	reqs := []string{"ping", "touch 1", "token"}
	if c.Token {
		reqs = []string{"ping", "token"}
	}
	answers, askErr := measure.Converse(askCtx, snap.Port, start, reqs...)
	if err := <-exited; err != nil {
		return run, fmt.Errorf("snapctl %q: %w\n%s%s", args, err, out.String(), errOut.String())
	}
	if askErr != nil {
		return run, askErr
	}
	if err := h.Check(answers); err != nil {
		return run, err
	}
	run.Ping = answers[0].At
	if c.Token {
		run.Token = answers[1].At
	} else {
		run.First, run.Token = answers[1].At, answers[2].At
	}
	lazy := c.Mode != report.WSEager
	rep, err := measure.ParseRestore(out.String(), lazy)
	if err != nil {
		return run, err
	}
	if (c.Mode == report.WSCopy || c.Mode == report.WSBlocks) && recorded {
		if !strings.Contains(out.String(), "fetched first") {
			return run, fmt.Errorf("%s: the working set was not used: %q%s: %w", c, out.String(), errOut.String(), measure.ErrOutput)
		}
	}
	run.Wall, run.Running, run.Total, run.Faults = wall, rep.Running, rep.Total, rep.Faults
	if err := snap.KillTree(ctx); err != nil {
		return run, err
	}
	h.Live = 0
	return run, nil
}
