package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lazyfs/lazyfs/test/bench/measure"
	"github.com/lazyfs/lazyfs/test/bench/report"
)

// weightsSeries dumps the weightserver of h.Size once per advice with the
// default option and restores both snapshots as report.WeightCases says, h.Runs
// times: round by round, case by case, the two advices back to back in an
// order that alternates between rounds, so that a slow spell of the
// machine lands on both.
func (h *Harness) weightsSeries(ctx context.Context) ([]*report.WeightsResult, error) {
	def := report.DefaultConfig()
	var out []*report.WeightsResult
	snaps := map[string]*Snapshot{}
	expect := map[string]Expectation{}
	defer func() {
		for _, s := range snaps {
			os.RemoveAll(s.Dir)
		}
	}()
	for _, advice := range report.WeightAdvices {
		w := &report.WeightsResult{Advice: advice}
		snap, exp, err := h.DumpWeights(ctx, w, def)
		if err != nil {
			return nil, fmt.Errorf("weightserver, advice %s: %w", advice, err)
		}
		snaps[advice], expect[advice] = snap, exp
		for _, c := range report.WeightCases() {
			w.Restores = append(w.Restores, &report.RestoreResult{Config: def, Case: c})
		}
		out = append(out, w)
	}
	files := map[string][]string{}
	for advice, s := range snaps {
		fs, err := measure.SnapshotFiles(s.Dir)
		if err != nil {
			return nil, err
		}
		files[advice] = fs
	}
	h.smaps = true
	defer func() { h.smaps = false }()
	for r := range h.Runs {
		for i, c := range report.WeightCases() {
			order := slices.Clone(out)
			if r%2 == 1 {
				slices.Reverse(order)
			}
			for _, w := range order {
				h.Expect = expect[w.Advice]
				run, err := h.RestoreOnce(ctx, snaps[w.Advice], files[w.Advice], c)
				if err != nil {
					return nil, fmt.Errorf("weightserver %s, %s: %w", w.Advice, c, err)
				}
				if run.HugeVMAs != w.HugeVMAs {
					return nil, fmt.Errorf("weightserver %s, %s: %d VMAs with hg after the restore, %d in the original: %w",
						w.Advice, c, run.HugeVMAs, w.HugeVMAs, report.ErrInsane)
				}
				w.Restores[i].Runs = append(w.Restores[i].Runs, run)
				h.Logf("restore weights %-8s %-24s %s run %d/%d: runs %s, ping %s, touch 1 %s, token %s, all in %s, exit %s, huge %d MiB",
					w.Advice, c.Label(), c.Cache(), r+1, h.Runs, Millis(run.Running), Millis(run.Ping), Millis(run.First), Millis(run.Token),
					Millis(run.Total), Millis(run.Wall), run.AnonHuge>>20)
			}
		}
	}
	h.Expect = Expectation{}
	return out, nil
}

// DumpWeights starts a weightserver with w's advice, learns its answers
// and its huge pages, and dumps it with cfg.
func (h *Harness) DumpWeights(ctx context.Context, w *report.WeightsResult, cfg report.DumpConfig) (*Snapshot, Expectation, error) {
	ctx, cancel := context.WithTimeout(ctx, h.OpTimeout())
	defer cancel()
	srv, err := measure.StartServer(ctx, h.Tools, h.Tools.Weights, h.Size, []string{"42", w.Advice}, h.LogPath, h.Work)
	if err != nil {
		return nil, Expectation{}, err
	}
	h.Live = srv.PID
	if ms, err := srv.Ready.Int("init_ms"); err == nil {
		w.Init = time.Duration(ms) * time.Millisecond
	}
	n, err := srv.Ready.Int("arrays")
	if err != nil {
		return nil, Expectation{}, fmt.Errorf("weightserver ready line %q: %w", srv.Ready.Text, measure.ErrOutput)
	}
	w.Arrays = int(n)
	h.Expect = Expectation{}
	if err := h.Learn(ctx, srv.Port); err != nil {
		return nil, Expectation{}, err
	}
	exp := h.Expect
	if w.HugeVMAs, w.AnonHuge, err = measure.HugeState(srv.PID); err != nil {
		return nil, Expectation{}, err
	}
	dir := filepath.Join(h.Work, "snap-weights-"+w.Advice)
	if err := os.RemoveAll(dir); err != nil {
		return nil, Expectation{}, err
	}
	args := append([]string{"dump", "-t", strconv.Itoa(srv.PID), "-D", dir}, cfg.Args...)
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, h.Tools.Snapctl, args...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = &stdout, &stderr, h.Work
	if err := cmd.Run(); err != nil {
		return nil, Expectation{}, fmt.Errorf("snapctl %q: %w\n%s%s", args, err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	if err := srv.WaitGone(ctx); err != nil {
		return nil, Expectation{}, err
	}
	h.Live = 0
	rep, err := measure.ParseDump(out)
	if err != nil {
		return nil, Expectation{}, err
	}
	if rep.PID != srv.PID {
		return nil, Expectation{}, fmt.Errorf("dump reported pid %d, want %d: %w", rep.PID, srv.PID, measure.ErrOutput)
	}
	h.WeightsDump = rep
	h.Logf("dump weights %s: %d arrays, %d VMAs with hg, %d MiB in huge pages, init %s; %s",
		w.Advice, w.Arrays, w.HugeVMAs, w.AnonHuge>>20, w.Init, strings.TrimSpace(out))
	return &Snapshot{Dir: dir, PID: srv.PID, Port: srv.Port, Pages: filepath.Join(dir, "pages-"+strconv.Itoa(srv.PID)+".img")}, exp, nil
}
