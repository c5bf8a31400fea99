package harness

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"time"

	"github.com/lazyfs/lazyfs/test/bench/measure"
	"github.com/lazyfs/lazyfs/test/bench/report"
)

// restoreSeries runs every restore case of a configuration h.Runs times,
// the cases interleaved within each round so that a slow spell of the
// machine does not land on one case only.
func (h *Harness) restoreSeries(ctx context.Context, snap *Snapshot, cfg report.DumpConfig) ([]*report.RestoreResult, error) {
	cases := report.RestoreCases(cfg)
	results := make([]*report.RestoreResult, len(cases))
	for i, c := range cases {
		results[i] = &report.RestoreResult{Config: cfg, Case: c}
	}
	files, err := measure.SnapshotFiles(snap.Dir)
	if err != nil {
		return nil, err
	}
	for r := range h.Runs {
		for i, c := range cases {
			run, err := h.RestoreOnce(ctx, snap, files, c)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c, err)
			}
			results[i].Runs = append(results[i].Runs, run)
			h.Logf("restore %-11s %-32s %s run %d/%d: runs %s, ping %s, touch 1 %s, token %s, all in %s, exit %s",
				cfg.Short, c.Label()+fmt.Sprintf(" threads=%d", c.Threads), c.Cache(), r+1, h.Runs,
				Millis(run.Running), Millis(run.Ping), Millis(run.First), Millis(run.Token), Millis(run.Total), Millis(run.Wall))
		}
	}
	return results, nil
}

// ms rounds a duration for progress lines.
func Millis(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// RestoreOnce restores snap once as c says, times the client's first
// answers, checks them, then kills the restored server and waits until its
// pid is free.
func (h *Harness) RestoreOnce(ctx context.Context, snap *Snapshot, files []string, c report.RestoreCase) (report.RestoreRun, error) {
	var run report.RestoreRun
	ctx, cancel := context.WithTimeout(ctx, h.OpTimeout())
	defer cancel()
	if measure.Alive(snap.PID) {
		return run, fmt.Errorf("pid %d is taken before the restore", snap.PID)
	}
	if err := measure.SetCache(c.Cold, files...); err != nil {
		return run, err
	}

	args := append(c.Args(snap.Dir), h.RestoreArgs...)
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, h.Tools.Snapctl, args...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = &out, &errOut, h.Work
	askCtx, stopAsking := context.WithCancel(ctx)
	defer stopAsking()
	type exit struct {
		wall time.Duration
		err  error
	}
	exited := make(chan exit, 1)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return run, fmt.Errorf("start snapctl: %w", err)
	}
	h.Live = snap.PID
	go func() {
		err := cmd.Wait()
		exited <- exit{time.Since(start), err}
		if err != nil {
			stopAsking() // no server is coming
		}
	}()

	var answers []measure.Answer
	var askErr error
	if !c.Idle {
		asks := []string{"ping", "touch 1", "token"}
		if c.TokenFirst {
			asks = []string{"ping", "token"}
		}
		answers, askErr = measure.Converse(askCtx, snap.Port, start, asks...)
	}
	e := <-exited
	if e.err != nil {
		return run, fmt.Errorf("snapctl %q: %w\n%s%s", args, e.err, out.String(), errOut.String())
	}
	if askErr != nil {
		return run, askErr
	}
	if c.Idle {
		// Every page is in: check the memory, untimed.
		if answers, askErr = measure.Converse(ctx, snap.Port, time.Now(), "touch 1", "token"); askErr != nil {
			return run, askErr
		}
	} else if c.TokenFirst {
		run.Ping, run.Token = answers[0].At, answers[1].At
	} else {
		run.Ping, run.First, run.Token = answers[0].At, answers[1].At, answers[2].At
	}
	if err := h.Check(answers); err != nil {
		return run, err
	}
	err := h.finishRestore(ctx, snap, c, out.String(), e.wall, &run)
	return run, err
}

// finishRestore fills in run from snapctl's output and, with h.smaps, the
// restored process's huge pages; then it kills the process.
func (h *Harness) finishRestore(ctx context.Context, snap *Snapshot, c report.RestoreCase, out string, wall time.Duration, run *report.RestoreRun) error {
	rep, err := measure.ParseRestore(out, c.Lazy())
	if err != nil {
		return err
	}
	if rep.PID != snap.PID {
		return fmt.Errorf("restore reported pid %d, want %d: %w", rep.PID, snap.PID, measure.ErrOutput)
	}
	run.Wall, run.Running, run.Total, run.Faults = wall, rep.Running, rep.Total, rep.Faults
	if h.smaps {
		if run.HugeVMAs, run.AnonHuge, err = measure.HugeState(snap.PID); err != nil {
			return err
		}
	}
	if err := measure.KillAndReap(ctx, snap.PID); err != nil {
		return err
	}
	h.Live = 0
	return nil
}
