package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"filippo.io/age"

	"github.com/lazyfs/lazyfs/engine/image/seal"
	"github.com/lazyfs/lazyfs/test/bench/harness"
	"github.com/lazyfs/lazyfs/test/bench/measure"
	"github.com/lazyfs/lazyfs/test/bench/report"
)

// The "crypt" series: what sealing a snapshot (dump --encrypt-to) costs.
// The modelserver is dumped with the default option in clear and sealed
// for an age recipient, alternately, h.Runs times each; the last snapshot
// of each is restored as report.CryptCases says, the two back to back in every
// round in alternating order, so that a slow spell of the machine lands on
// both.

func init() {
	harness.ExtraSeries = append(harness.ExtraSeries, harness.Series{Name: "crypt", Measure: measureCrypt})
}

// withIdentity runs f with $LAZYFS_IDENTITY set to key (unset if ""): the
// snapctl that RestoreOnce starts reads it, and refuses a snapshot in
// clear when it is set.
func withIdentity(key string, f func() error) error {
	if key == "" {
		os.Unsetenv(seal.IdentityEnv)
	} else {
		os.Setenv(seal.IdentityEnv, key)
	}
	defer os.Unsetenv(seal.IdentityEnv)
	return f()
}

func measureCrypt(ctx context.Context, h *harness.Harness, sr *report.SizeResult) error {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return err
	}
	key := filepath.Join(h.Work, "crypt-key.txt")
	if err := os.WriteFile(key, []byte(id.String()+"\n"), 0o600); err != nil {
		return err
	}
	def := report.DefaultConfig()
	cfgs := [2]report.DumpConfig{def, def}
	cfgs[1].Name, cfgs[1].Short = def.Name+" --encrypt-to", "sealed"
	cfgs[1].Args = append(append([]string(nil), def.Args...), "--encrypt-to", id.Recipient().String())
	keys := [2]string{"", key}
	res := &report.CryptResult{}
	var snaps [2]*harness.Snapshot
	defer func() {
		for _, s := range snaps {
			if s != nil {
				os.RemoveAll(s.Dir)
			}
		}
	}()
	for v := range cfgs {
		res.Dumps[v] = &report.DumpResult{Config: cfgs[v]}
		for _, c := range report.CryptCases() {
			res.Restores[v] = append(res.Restores[v], &report.RestoreResult{Config: cfgs[v], Case: c})
		}
	}
	order := func(r int) []int {
		if r%2 == 1 {
			return []int{1, 0}
		}
		return []int{0, 1}
	}
	for r := range h.Runs {
		for _, v := range order(r) {
			dir := filepath.Join(h.Work, "snap-crypt-"+report.CryptVariants[v])
			if err := os.RemoveAll(dir); err != nil {
				return err
			}
			s, err := h.DumpOnce(ctx, &report.SizeResult{}, cfgs[v], dir, res.Dumps[v])
			if err != nil {
				return fmt.Errorf("dump %s: %w", report.CryptVariants[v], err)
			}
			snaps[v] = s
			d := res.Dumps[v]
			h.Logf("dump crypt %-6s run %d/%d: %s, frozen %s, image %d bytes", report.CryptVariants[v], r+1, h.Runs,
				harness.Millis(d.Wall[len(d.Wall)-1]), d.Freeze[len(d.Freeze)-1], d.Image)
		}
	}
	var files [2][]string
	for v, s := range snaps {
		if files[v], err = measure.SnapshotFiles(s.Dir); err != nil {
			return err
		}
	}
	for r := range h.Runs {
		for i, c := range report.CryptCases() {
			for _, v := range order(r) {
				var run report.RestoreRun
				err := withIdentity(keys[v], func() error {
					var err error
					run, err = h.RestoreOnce(ctx, snaps[v], files[v], c)
					return err
				})
				if err != nil {
					return fmt.Errorf("restore %s, %s: %w", report.CryptVariants[v], c, err)
				}
				res.Restores[v][i].Runs = append(res.Restores[v][i].Runs, run)
				h.Logf("restore crypt %-6s %-24s %s run %d/%d: runs %s, touch 1 %s, token %s, all in %s, exit %s",
					report.CryptVariants[v], c.Label(), c.Cache(), r+1, h.Runs, harness.Millis(run.Running), harness.Millis(run.First), harness.Millis(run.Token), harness.Millis(run.Total), harness.Millis(run.Wall))
			}
		}
	}
	sr.Crypt = res
	return nil
}
