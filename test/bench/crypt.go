package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"filippo.io/age"

	"github.com/lazyfs/lazyfs/engine/image"
)

// The "crypt" series: what sealing a snapshot (dump --encrypt-to) costs.
// The modelserver is dumped with the default option in clear and sealed
// for an age recipient, alternately, h.runs times each; the last snapshot
// of each is restored as cryptCases says, the two back to back in every
// round in alternating order, so that a slow spell of the machine lands on
// both.

func init() {
	extraSeries = append(extraSeries, series{Name: "crypt", Measure: measureCrypt})
}

// cryptResult is the crypt series of one size: [0] in clear, [1] sealed.
type cryptResult struct {
	Dumps    [2]*dumpResult
	Restores [2][]*restoreResult
}

// cryptVariants names the two sides of the series.
var cryptVariants = [2]string{"clear", "sealed"}

// cryptCases are the restores of both snapshots.
func cryptCases() []restoreCase {
	return []restoreCase{
		{Mode: eager, Threads: defThreads},
		{Mode: eager, Cold: true, Threads: defThreads},
		{Mode: lazyMount, Threads: defThreads},
		{Mode: lazyMount, Cold: true, Threads: defThreads},
		{Mode: lazyDirect, Threads: defThreads},
		{Mode: lazyDirect, Cold: true, Threads: defThreads},
	}
}

// withIdentity runs f with $LAZYFS_IDENTITY set to key (unset if ""): the
// snapctl that restoreOnce starts reads it, and refuses a snapshot in
// clear when it is set.
func withIdentity(key string, f func() error) error {
	if key == "" {
		os.Unsetenv(image.IdentityEnv)
	} else {
		os.Setenv(image.IdentityEnv, key)
	}
	defer os.Unsetenv(image.IdentityEnv)
	return f()
}

func measureCrypt(ctx context.Context, h *harness, sr *sizeResult) error {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return err
	}
	key := filepath.Join(h.work, "crypt-key.txt")
	if err := os.WriteFile(key, []byte(id.String()+"\n"), 0o600); err != nil {
		return err
	}
	def := defaultConfig()
	cfgs := [2]dumpConfig{def, def}
	cfgs[1].Name, cfgs[1].Short = def.Name+" --encrypt-to", "sealed"
	cfgs[1].Args = append(append([]string(nil), def.Args...), "--encrypt-to", id.Recipient().String())
	keys := [2]string{"", key}
	res := &cryptResult{}
	var snaps [2]*snapshot
	defer func() {
		for _, s := range snaps {
			if s != nil {
				os.RemoveAll(s.Dir)
			}
		}
	}()
	for v := range cfgs {
		res.Dumps[v] = &dumpResult{Config: cfgs[v]}
		for _, c := range cryptCases() {
			res.Restores[v] = append(res.Restores[v], &restoreResult{Config: cfgs[v], Case: c})
		}
	}
	order := func(r int) []int {
		if r%2 == 1 {
			return []int{1, 0}
		}
		return []int{0, 1}
	}
	for r := range h.runs {
		for _, v := range order(r) {
			dir := filepath.Join(h.work, "snap-crypt-"+cryptVariants[v])
			if err := os.RemoveAll(dir); err != nil {
				return err
			}
			s, err := h.dumpOnce(ctx, &sizeResult{}, cfgs[v], dir, res.Dumps[v])
			if err != nil {
				return fmt.Errorf("dump %s: %w", cryptVariants[v], err)
			}
			snaps[v] = s
			d := res.Dumps[v]
			h.logf("dump crypt %-6s run %d/%d: %s, frozen %s, image %d bytes", cryptVariants[v], r+1, h.runs,
				ms(d.Wall[len(d.Wall)-1]), d.Freeze[len(d.Freeze)-1], d.Image)
		}
	}
	var files [2][]string
	for v, s := range snaps {
		if files[v], err = snapshotFiles(s.Dir); err != nil {
			return err
		}
	}
	for r := range h.runs {
		for i, c := range cryptCases() {
			for _, v := range order(r) {
				var run restoreRun
				err := withIdentity(keys[v], func() error {
					var err error
					run, err = h.restoreOnce(ctx, snaps[v], files[v], c)
					return err
				})
				if err != nil {
					return fmt.Errorf("restore %s, %s: %w", cryptVariants[v], c, err)
				}
				res.Restores[v][i].Runs = append(res.Restores[v][i].Runs, run)
				h.logf("restore crypt %-6s %-24s %s run %d/%d: runs %s, touch 1 %s, token %s, all in %s, exit %s",
					cryptVariants[v], c.Label(), c.Cache(), r+1, h.runs, ms(run.Running), ms(run.First), ms(run.Token), ms(run.Total), ms(run.Wall))
			}
		}
	}
	sr.Crypt = res
	return nil
}

func validateCrypt(runs int, sr *sizeResult, bad func(string, ...any)) {
	c := sr.Crypt
	if c == nil {
		return
	}
	for v := range c.Dumps {
		if d := c.Dumps[v]; d == nil || len(d.Wall) != runs {
			bad("crypt %s: dumps missing", cryptVariants[v])
		}
		if len(c.Restores[v]) != len(cryptCases()) {
			bad("crypt %s: %d restore cases, want %d", cryptVariants[v], len(c.Restores[v]), len(cryptCases()))
			continue
		}
		for _, r := range c.Restores[v] {
			if len(r.Runs) != runs {
				bad("crypt %s %s: %d runs, want %d", cryptVariants[v], r.Case, len(r.Runs), runs)
			}
			for i, run := range r.Runs {
				if msg := checkRun(r.Case, run); msg != "" {
					bad("crypt %s %s run %d: %s", cryptVariants[v], r.Case, i, msg)
				}
			}
		}
	}
}

// cryptRatio formats sealed/clear of two medians.
func cryptRatio(clear, sealed time.Duration) string {
	if clear <= 0 || sealed <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", sealed.Seconds()/clear.Seconds())
}

func renderCrypt(m *md, sr *sizeResult) {
	c := sr.Crypt
	if c == nil {
		return
	}
	m.p("### crypt: sealed snapshots (`--encrypt-to`) against snapshots in clear")
	m.p("")
	m.p("The modelserver dumped with `%s` in clear and sealed for an age X25519 recipient (every block AES-256-GCM), alternately; the last snapshot of each restored with its identity as below, the two back to back in every round. *sealed/clear* is the ratio of the medians; the target is at most 1.15× on every row.", defaultConfig().Name)
	m.p("")
	m.header("measurement", "cache", "clear", "sealed", "sealed/clear")
	if c.Dumps[0] != nil && c.Dumps[1] != nil {
		d0, d1 := summarize(c.Dumps[0].Wall), summarize(c.Dumps[1].Wall)
		m.row("dump (command)", "—", d0.String(), d1.String(), cryptRatio(d0.Med, d1.Med))
		f0, f1 := summarize(c.Dumps[0].Freeze), summarize(c.Dumps[1].Freeze)
		m.row("dump (process frozen)", "—", f0.String(), f1.String(), cryptRatio(f0.Med, f1.Med))
		m.row("image", "—", fmt.Sprintf("%d bytes", c.Dumps[0].Image), fmt.Sprintf("%d bytes", c.Dumps[1].Image), fmt.Sprintf("%.4f×", float64(c.Dumps[1].Image)/float64(max(1, c.Dumps[0].Image))))
	}
	for i, cs := range cryptCases() {
		if i >= len(c.Restores[0]) || i >= len(c.Restores[1]) {
			break
		}
		a, b := c.Restores[0][i], c.Restores[1][i]
		figs := []struct {
			name string
			f    func(restoreRun) time.Duration
		}{{"command exits", wallOf}}
		if cs.Lazy() {
			figs = []struct {
				name string
				f    func(restoreRun) time.Duration
			}{{"`touch 1` answered", firstOf}, {"`token` answered", tokenOf}, {"all memory in", totalOf}}
		}
		for _, fg := range figs {
			m.row(cs.Label()+": "+fg.name, cs.Cache(), cell(a, fg.f), cell(b, fg.f), cryptRatio(a.dist(fg.f).Med, b.dist(fg.f).Med))
		}
	}
	m.p("")
}
