package main

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

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/units"
	"github.com/lazyfs/lazyfs/test/bench/harness"
	"github.com/lazyfs/lazyfs/test/bench/measure"
	"github.com/lazyfs/lazyfs/test/bench/report"
)

// The codec series: each model server dumped with each block codec
// (snapctl dump --codec), its image and the ratio of its weights, then
// restored eagerly and lazily, timing the first `token` (a pass over all
// the weights).

func init() {
	harness.ExtraSeries = append(harness.ExtraSeries, harness.Series{Name: "codec", Measure: measureCodecs})
}

// benchCodecs are the codecs compared, the plain one first.
var benchCodecs = []string{"lz4", "shuffle-lz4", "shuffle-huff"}

// codecFixture is a model server of the series.
type codecFixture struct {
	Name    string // report name
	Weights string // "bf16" or "float32"
	prog    func(t measure.Tools) string
	extra   []string
}

var codecFixtures = []codecFixture{
	{Name: "modelserver", Weights: "bf16", prog: func(t measure.Tools) string { return t.Modelserver }},
	{Name: "weightserver", Weights: "float32", prog: func(t measure.Tools) string { return t.Weights }, extra: []string{"42", "hugepage"}},
}

// measureCodecs dumps each fixture once per codec, then restores the
// snapshots of one fixture round by round, case by case, the codecs back
// to back in an order that turns between rounds.
func measureCodecs(ctx context.Context, h *harness.Harness, sr *report.SizeResult) error {
	fixtures := codecFixtures
	if h.Smoke {
		fixtures = fixtures[:1] // the modelserver
	}
	for _, fx := range fixtures {
		var results []*report.CodecResult
		snaps := map[string]*harness.Snapshot{}
		var expect harness.Expectation
		cleanup := func() {
			for _, s := range snaps {
				os.RemoveAll(s.Dir)
			}
		}
		for _, name := range benchCodecs {
			cr, snap, exp, err := dumpCodec(ctx, h, fx, name)
			if err != nil {
				cleanup()
				return fmt.Errorf("%s --codec %s: %w", fx.Name, name, err)
			}
			if expect != (harness.Expectation{}) && exp != expect {
				cleanup()
				return fmt.Errorf("%s --codec %s: the server answered %+v, the first %+v: %w", fx.Name, name, exp, expect, report.ErrInsane)
			}
			expect = exp
			snaps[name] = snap
			for _, c := range report.CodecCases(h.Smoke) {
				cr.Restores = append(cr.Restores, &report.RestoreResult{Case: c})
			}
			results = append(results, cr)
		}
		files := map[string][]string{}
		for name, s := range snaps {
			fs, err := measure.SnapshotFiles(s.Dir)
			if err != nil {
				cleanup()
				return err
			}
			files[name] = fs
		}
		h.Expect = expect
		for r := range h.Runs {
			for i, c := range report.CodecCases(h.Smoke) {
				order := slices.Clone(results)
				if r%2 == 1 {
					slices.Reverse(order)
				}
				for _, cr := range order {
					run, err := h.RestoreOnce(ctx, snaps[cr.Codec], files[cr.Codec], c)
					if err != nil {
						cleanup()
						return fmt.Errorf("%s --codec %s, %s: %w", fx.Name, cr.Codec, c, err)
					}
					cr.Restores[i].Runs = append(cr.Restores[i].Runs, run)
					h.Logf("restore %s %-12s %-24s %s run %d/%d: runs %s, touch 1 %s, token %s, all in %s",
						fx.Name, cr.Codec, c.Label(), c.Cache(), r+1, h.Runs, harness.Millis(run.Running), harness.Millis(run.First), harness.Millis(run.Token), harness.Millis(run.Total))
				}
			}
		}
		h.Expect = harness.Expectation{}
		cleanup()
		sr.Codecs = append(sr.Codecs, results...)
	}
	return nil
}

// dumpCodec starts fixture fx, learns its answers and dumps it with
// --codec name, then reads the snapshot's figures.
func dumpCodec(ctx context.Context, h *harness.Harness, fx codecFixture, name string) (*report.CodecResult, *harness.Snapshot, harness.Expectation, error) {
	// The fixture's start-up, its questions and the dump.
	ctx, cancel := context.WithTimeout(ctx, 3*h.OpTimeout())
	defer cancel()
	srv, err := measure.StartServer(ctx, h.Tools, fx.prog(h.Tools), h.Size, fx.extra, h.LogPath, h.Work)
	if err != nil {
		return nil, nil, harness.Expectation{}, err
	}
	h.Live = srv.PID
	h.Expect = harness.Expectation{}
	if err := h.Learn(ctx, srv.Port); err != nil {
		return nil, nil, harness.Expectation{}, err
	}
	exp := h.Expect
	h.Expect = harness.Expectation{}
	// modelserver: the weights are a range of its mapping.
	var wlo, whi uint64
	if a, ok := srv.Ready.Fields["addr"]; ok && fx.Name == "modelserver" {
		addr, err1 := strconv.ParseUint(a, 0, 64)
		off, err2 := strconv.ParseUint(srv.Ready.Fields["weights_off"], 10, 64)
		n, err3 := strconv.ParseUint(srv.Ready.Fields["weights_len"], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, nil, harness.Expectation{}, fmt.Errorf("modelserver ready line %q: %w", srv.Ready.Text, measure.ErrOutput)
		}
		wlo, whi = addr+off, addr+off+n
	}
	dir := filepath.Join(h.Work, "snap-codec-"+fx.Name+"-"+name)
	if err := os.RemoveAll(dir); err != nil {
		return nil, nil, harness.Expectation{}, err
	}
	args := []string{"dump", "-t", strconv.Itoa(srv.PID), "-D", dir, "--codec", name}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, h.Tools.Snapctl, args...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = &stdout, &stderr, h.Work
	if err := cmd.Run(); err != nil {
		return nil, nil, harness.Expectation{}, fmt.Errorf("snapctl %q: %w\n%s%s", args, err, stdout.String(), stderr.String())
	}
	if err := srv.WaitGone(ctx); err != nil {
		return nil, nil, harness.Expectation{}, err
	}
	h.Live = 0
	rep, err := measure.ParseDump(stdout.String())
	if err != nil {
		return nil, nil, harness.Expectation{}, err
	}
	cr := &report.CodecResult{Fixture: fx.Name, Weights: fx.Weights, Codec: name, Dump: rep.Total, Freeze: rep.Freeze}
	if err := readCodecImage(cr, dir, srv.PID, wlo, whi); err != nil {
		return nil, nil, harness.Expectation{}, err
	}
	h.Logf("dump %s --codec %s: %s; weights %s stored in %s (%.3f)", fx.Name, name, strings.TrimSpace(stdout.String()),
		units.FormatSize(cr.WeightBytes), units.FormatSize(cr.WeightStored), cr.WeightRatio())
	snap := &harness.Snapshot{Dir: dir, PID: srv.PID, Port: srv.Port, Pages: filepath.Join(dir, "pages-"+strconv.Itoa(srv.PID)+".img")}
	return cr, snap, exp, nil
}

// readCodecImage fills in cr's figures of the snapshot in dir. The weights
// are the blocks in [wlo, whi) if whi > 0, else the blocks of unnamed
// anonymous mappings of 1 MiB or more (the weightserver's arrays, one
// mapping each).
func readCodecImage(cr *report.CodecResult, dir string, pid int, wlo, whi uint64) error {
	s, err := image.Open(dir)
	if err != nil {
		return err
	}
	defer s.Close()
	if s.Manifest.Compression != cr.Codec {
		return fmt.Errorf("manifest of --codec %s says %q: %w", cr.Codec, s.Manifest.Compression, report.ErrInsane)
	}
	st, err := s.State(pid)
	if err != nil {
		return err
	}
	r, err := s.OpenPages(pid, image.ReaderOptions{})
	if err != nil {
		return err
	}
	defer r.Close()
	stats := r.Stats()
	cr.Memory, cr.Pages, cr.Shuffled = stats.Total.Bytes, stats.FileSize, stats.Shuffle.Bytes
	weight := func(addr uint64) bool {
		if whi > 0 {
			return addr >= wlo && addr < whi
		}
		for _, v := range st.VMAs {
			if addr >= v.Start && addr < v.End {
				return v.Kind == image.VMAAnon && v.Name == "" && v.End-v.Start >= 1<<20
			}
		}
		return false
	}
	for b := range r.Blocks() {
		if weight(b.Addr) {
			cr.WeightBytes += uint64(b.Len)
			cr.WeightStored += uint64(b.StoredLen)
		}
	}
	if cr.WeightBytes == 0 {
		return fmt.Errorf("%s: no weights found in the snapshot: %w", cr.Fixture, report.ErrInsane)
	}
	return nil
}
