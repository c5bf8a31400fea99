package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
	"github.com/lazyfs/lazyfs/test/bench/harness"
	"github.com/lazyfs/lazyfs/test/bench/measure"
	"github.com/lazyfs/lazyfs/test/bench/report"
)

// The replicas series: one modelserver snapshot restored N times (1, 2,
// 4), each copy with restore --pidns --netns new, one after another (the
// next started once the one before answered "touch 1" and has all its
// memory, as a service scales out): lazily through one lazyfs mount that
// every copy faults through, the first copy recording the working set
// that the later ones fetch first, or with no working set at all; against
// eager restores. Per copy, the time from its snapctl's start to its
// "touch 1" answer; per case, once every copy has all its memory, the
// memory they and the page source hold.

func init() {
	harness.ExtraSeries = append(harness.ExtraSeries, harness.Series{Name: "replicas", Measure: replicasSeries})
}

// replicaCounts are how many copies each case starts.
var replicaCounts = []int{1, 2, 4}

var replicaModes = []string{report.RepLazyWS, report.RepLazyOff, report.RepEager}

// replicasSeries dumps one modelserver and runs every case h.Runs times,
// the cases interleaved within each round.
func replicasSeries(ctx context.Context, h *harness.Harness, sr *report.SizeResult) error {
	cfg := report.DefaultConfig()
	dir := filepath.Join(h.Work, "snap-replicas")
	var dr report.DumpResult
	snap, err := h.DumpOnce(ctx, sr, cfg, dir, &dr)
	if err != nil {
		return fmt.Errorf("dump: %w", err)
	}
	defer os.RemoveAll(snap.Dir)
	files, err := measure.SnapshotFiles(snap.Dir)
	if err != nil {
		return err
	}
	var results []*report.ReplicasResult
	for _, mode := range replicaModes {
		for _, n := range replicaCounts {
			results = append(results, &report.ReplicasResult{Mode: mode, N: n})
		}
	}
	for r := range h.Runs {
		for _, res := range results {
			if err := measure.WarmUp(files...); err != nil {
				return err
			}
			run, recorded, err := replicasOnce(ctx, h, snap, res.Mode, res.N)
			if err != nil {
				return fmt.Errorf("%s x%d: %w", res.Mode, res.N, err)
			}
			res.Runs = append(res.Runs, run)
			if recorded != "" {
				res.Recorded = recorded
			}
			var t1 []string
			for i, d := range run.Touch1 {
				t1 = append(t1, fmt.Sprintf("%s (runs %s, %d faults)", harness.Millis(d), harness.Millis(run.Running[i]), run.Faults[i]))
			}
			h.Logf("replicas %-23s x%d run %d/%d: touch 1 %s; Pss %s, page cache %s (mem file %s), server %s (block cache %s)",
				res.Mode, res.N, r+1, h.Runs, strings.Join(t1, ", "), units.FormatSize(run.Pss),
				units.FormatSize(run.PageCache), units.FormatSize(run.MemCache), units.FormatSize(run.Server),
				units.FormatSize(run.BlockCache))
		}
	}
	sr.Replicas = results
	return nil
}

// replicaProc is one copy being restored.
type replicaProc struct {
	cmd     *exec.Cmd
	out     bytes.Buffer
	pidfile string
	exited  chan error
	pid     int // ours, once the pidfile names it
	init    int
}

// replicasOnce runs one case: a fresh lazyfs mount for a lazy one, n
// copies started one after another, their memory measured, all killed
// and the mount unmounted. It returns the first copy's "working set
// recorded" line if it recorded one.
func replicasOnce(ctx context.Context, h *harness.Harness, snap *harness.Snapshot, mode string, n int) (run report.ReplicasRun, recorded string, err error) {
	ctx, cancel := context.WithTimeout(ctx, h.OpTimeout()*time.Duration(n+1))
	defer cancel()
	wsPath := filepath.Join(snap.Dir, "workingset-"+strconv.Itoa(snap.PID)+".img")
	if err := os.Remove(wsPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return run, "", err
	}
	var mnt string
	if report.ReplicaLazy(mode) {
		mnt = filepath.Join(h.Work, "mnt-replicas")
		if err := os.MkdirAll(mnt, 0o700); err != nil {
			return run, "", err
		}
		if out, err := exec.CommandContext(ctx, h.Tools.Lazyfs, "--background", snap.Dir, mnt).CombinedOutput(); err != nil {
			return run, "", fmt.Errorf("lazyfs --background: %w: %s", err, out)
		}
		defer func() {
			if out, uerr := exec.Command(h.Tools.Lazyfs, "-u", mnt).CombinedOutput(); uerr != nil && err == nil {
				err = fmt.Errorf("lazyfs -u: %w: %s", uerr, out)
			}
		}()
	}
	var reps []*replicaProc
	defer func() {
		for _, r := range reps {
			r.kill(ctx)
		}
	}()
	for i := range n {
		args, record := replicaArgs(snap.Dir, mode, mnt, i)
		r, start, err := startReplica(ctx, h, args, i)
		if err != nil {
			return run, "", err
		}
		reps = append(reps, r)
		if err := r.waitPid(ctx); err != nil {
			return run, "", err
		}
		var as []measure.Answer
		err = measure.InNetns(r.pid, func() error {
			var err error
			as, err = measure.Converse(ctx, snap.Port, start, "ping", "touch 1")
			return err
		})
		if record {
			// It answered "touch 1": what it touched so far is the
			// working set.
			if serr := r.cmd.Process.Signal(syscall.SIGUSR1); serr != nil && err == nil {
				err = serr
			}
		}
		if err != nil {
			return run, "", fmt.Errorf("copy %d: %w\n%s", i+1, err, r.out.String())
		}
		if err := h.Check(as); err != nil {
			return run, "", fmt.Errorf("copy %d: %w", i+1, err)
		}
		run.Touch1 = append(run.Touch1, as[1].At)
		// The next copy starts once this one has all its memory: it
		// finds the blocks decoded, and no prefetch competes with it for
		// the CPUs.
		if err := r.waitExit(ctx, i); err != nil {
			return run, "", err
		}
		out := r.out.String()
		rep, err := measure.ParseRestore(out, report.ReplicaLazy(mode))
		if err != nil {
			return run, "", fmt.Errorf("copy %d: %w", i+1, err)
		}
		run.Running, run.Faults = append(run.Running, rep.Running), append(run.Faults, rep.Faults)
		if recorded, err = checkReplicaOutput(out, mode, record, wsPath, i, recorded); err != nil {
			return run, "", err
		}
	}
	if err := replicasMemory(&run, reps, snap, mode, h.Tools.Lazyfs, mnt); err != nil {
		return run, "", err
	}
	return run, recorded, nil
}

// replicaArgs are the snapctl arguments of copy i of a case of mode, and
// whether it records the working set.
func replicaArgs(dir, mode, mnt string, i int) (args []string, record bool) {
	args = []string{"restore", "-D", dir, "--pidns", "--netns", "new"}
	record = mode == report.RepLazyWS && i == 0
	switch {
	case record:
		args = append(args, "--lazy", "--mount", mnt, "--record-working-set", "--record-for", "5m")
	case mode == report.RepLazyWS:
		args = append(args, "--lazy", "--mount", mnt)
	case mode == report.RepLazyOff:
		args = append(args, "--lazy", "--mount", mnt, "--working-set", "off")
	}
	return args, record
}

// checkReplicaOutput checks what copy i's snapctl printed against its
// mode: copy 1 of the working-set mode recorded one at wsPath (its line
// is returned), the others of that mode fetched it first, and no copy of
// another mode used one. recorded is returned unchanged for the others.
func checkReplicaOutput(out, mode string, record bool, wsPath string, i int, recorded string) (string, error) {
	switch {
	case record:
		// The next copies find the working set written.
		for line := range strings.Lines(out) {
			if strings.HasPrefix(line, "working set recorded:") {
				recorded = strings.TrimSpace(line)
			}
		}
		if _, err := os.Stat(wsPath); recorded == "" || err != nil {
			return recorded, fmt.Errorf("copy 1 recorded no working set in %s (%v): %q: %w", wsPath, err, out, measure.ErrOutput)
		}
	case mode == report.RepLazyWS:
		if !strings.Contains(out, "fetched first from its copy, "+wsPath) {
			return recorded, fmt.Errorf("copy %d did not fetch the working set first: %q: %w", i+1, out, measure.ErrOutput)
		}
	case strings.Contains(out, "working set"):
		return recorded, fmt.Errorf("copy %d (%s) used a working set: %q: %w", i+1, mode, out, measure.ErrOutput)
	}
	return recorded, nil
}

// replicasMemory adds to run the memory of the copies once each has all
// of its memory: their Pss and anonymous memory, the page cache of the
// pages file and (lazy) of the mount's mem file, and the lazyfs server's.
func replicasMemory(run *report.ReplicasRun, reps []*replicaProc, snap *harness.Snapshot, mode, lazyfs, mnt string) error {
	for _, r := range reps {
		for _, pid := range []int{r.pid, r.init} {
			pss, anon, err := measure.SmapsRollup(pid)
			if err != nil {
				return err
			}
			run.Pss += pss
			run.Anon += anon
		}
	}
	var err error
	run.PageCache, err = measure.ResidentBytes(snap.Pages)
	if err != nil {
		return err
	}
	if report.ReplicaLazy(mode) {
		mem := filepath.Join(mnt, strconv.Itoa(snap.PID), "mem")
		c, err := measure.ResidentBytes(mem)
		if err != nil {
			return err
		}
		run.PageCache += c
		run.MemCache = c
		if run.Server, err = measure.ServerRSS(lazyfs, mnt); err != nil {
			return err
		}
		if run.BlockCache, err = measure.BlockCacheBytes(filepath.Join(mnt, strconv.Itoa(snap.PID), "stats")); err != nil {
			return err
		}
	}
	return nil
}

// startReplica starts snapctl with args for copy i.
func startReplica(ctx context.Context, h *harness.Harness, args []string, i int) (*replicaProc, time.Time, error) {
	r := &replicaProc{pidfile: filepath.Join(h.Work, fmt.Sprintf("replica-%d.pid", i)), exited: make(chan error, 1)}
	os.Remove(r.pidfile)
	r.cmd = exec.CommandContext(ctx, h.Tools.Snapctl, append(args, "--pidfile", r.pidfile)...)
	r.cmd.Stdout, r.cmd.Stderr, r.cmd.Dir = &r.out, &r.out, h.Work
	start := time.Now()
	if err := r.cmd.Start(); err != nil {
		return nil, start, err
	}
	go func() { r.exited <- r.cmd.Wait() }()
	return r, start, nil
}

// waitExit waits until copy i's snapctl exits, which it does once the
// copy has all its memory, and leaves its error in r.exited for kill.
func (r *replicaProc) waitExit(ctx context.Context, i int) error {
	select {
	case err := <-r.exited:
		r.exited <- err
		if err != nil {
			return fmt.Errorf("copy %d: snapctl: %w\n%s", i+1, err, r.out.String())
		}
	case <-ctx.Done():
		return fmt.Errorf("copy %d: snapctl still running: %w", i+1, ctx.Err())
	}
	return nil
}

// waitPid waits for the copy's pidfile, then reads its init (its parent).
func (r *replicaProc) waitPid(ctx context.Context) error {
	for {
		if b, err := os.ReadFile(r.pidfile); err == nil && len(b) > 0 && b[len(b)-1] == '\n' {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				return fmt.Errorf("pidfile %q: %w", b, measure.ErrOutput)
			}
			r.pid = pid
			st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil {
				return err
			}
			f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:]))
			if r.init, err = strconv.Atoi(f[1]); err != nil || r.init <= 1 {
				return fmt.Errorf("parent of copy %d: %q: %w", pid, f[1], measure.ErrOutput)
			}
			return nil
		}
		select {
		case err := <-r.exited:
			r.exited <- err
			return fmt.Errorf("snapctl exited (%v) before it wrote the pidfile:\n%s", err, r.out.String())
		case <-ctx.Done():
			return fmt.Errorf("wait for the pidfile: %w", ctx.Err())
		case <-time.After(measure.PollEvery):
		}
	}
}

// kill kills the copy's init (the kernel kills the copy with it, and its
// namespaces go), waits until both are gone and snapctl is reaped.
func (r *replicaProc) kill(ctx context.Context) {
	if r.init > 0 {
		_ = measure.KillAndReap(ctx, r.init)
	}
	if r.pid > 0 {
		_ = measure.KillAndReap(ctx, r.pid)
	}
	if r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
	}
	err := <-r.exited
	r.exited <- err
}
