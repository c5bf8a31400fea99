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
	"time"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/units"
)

// The codec series: each model server dumped with each block codec
// (snapctl dump --codec), its image and the ratio of its weights, then
// restored eagerly and lazily, timing the first `token` (a pass over all
// the weights).

func init() {
	extraSeries = append(extraSeries, series{Name: "codec", Measure: measureCodecs})
}

// benchCodecs are the codecs compared, the plain one first.
var benchCodecs = []string{"lz4", "shuffle-lz4", "shuffle-huff"}

// codecFixture is a model server of the series.
type codecFixture struct {
	Name    string // report name
	Weights string // "bf16" or "float32"
	prog    func(t tools) string
	extra   []string
}

var codecFixtures = []codecFixture{
	{Name: "modelserver", Weights: "bf16", prog: func(t tools) string { return t.Modelserver }},
	{Name: "weightserver", Weights: "float32", prog: func(t tools) string { return t.Weights }, extra: []string{"42", "hugepage"}},
}

// codecCases are the restores of each snapshot of the series; a smoke run
// does the lazy one through the mount only.
func codecCases(smoke bool) []restoreCase {
	if smoke {
		return []restoreCase{{Mode: lazyMount, Threads: defThreads}}
	}
	return []restoreCase{
		{Mode: eager, Threads: defThreads},
		{Mode: eager, Cold: true, Threads: defThreads},
		{Mode: lazyMount, Threads: defThreads},
		{Mode: lazyMount, Cold: true, Threads: defThreads},
		{Mode: lazyDirect, Threads: defThreads},
	}
}

// codecResult is one fixture dumped with one codec.
type codecResult struct {
	Fixture string
	Weights string // "bf16" or "float32"
	Codec   string
	Memory  uint64 // bytes of memory in the snapshot
	Pages   uint64 // the pages file
	// WeightBytes and WeightStored: the weights' memory and the stored
	// bytes of the blocks that hold it.
	WeightBytes, WeightStored uint64
	Shuffled                  uint64 // bytes of memory in shuffled blocks
	Dump, Freeze              time.Duration
	Restores                  []*restoreResult
}

// WeightRatio is the weights' stored bytes over their memory.
func (c *codecResult) WeightRatio() float64 {
	if c.WeightBytes == 0 {
		return 0
	}
	return float64(c.WeightStored) / float64(c.WeightBytes)
}

func (c *codecResult) find(k restoreCase) *restoreResult {
	for _, r := range c.Restores {
		if r.Case == k {
			return r
		}
	}
	return nil
}

// measureCodecs dumps each fixture once per codec, then restores the
// snapshots of one fixture round by round, case by case, the codecs back
// to back in an order that turns between rounds.
func measureCodecs(ctx context.Context, h *harness, sr *sizeResult) error {
	fixtures := codecFixtures
	if h.smoke {
		fixtures = fixtures[:1] // the modelserver
	}
	for _, fx := range fixtures {
		var results []*codecResult
		snaps := map[string]*snapshot{}
		var expect expectation
		cleanup := func() {
			for _, s := range snaps {
				os.RemoveAll(s.Dir)
			}
		}
		for _, name := range benchCodecs {
			cr, snap, exp, err := h.dumpCodec(ctx, fx, name)
			if err != nil {
				cleanup()
				return fmt.Errorf("%s --codec %s: %w", fx.Name, name, err)
			}
			if expect != (expectation{}) && exp != expect {
				cleanup()
				return fmt.Errorf("%s --codec %s: the server answered %+v, the first %+v: %w", fx.Name, name, exp, expect, ErrInsane)
			}
			expect = exp
			snaps[name] = snap
			for _, c := range codecCases(h.smoke) {
				cr.Restores = append(cr.Restores, &restoreResult{Case: c})
			}
			results = append(results, cr)
		}
		files := map[string][]string{}
		for name, s := range snaps {
			fs, err := snapshotFiles(s.Dir)
			if err != nil {
				cleanup()
				return err
			}
			files[name] = fs
		}
		h.expect = expect
		for r := range h.runs {
			for i, c := range codecCases(h.smoke) {
				order := slices.Clone(results)
				if r%2 == 1 {
					slices.Reverse(order)
				}
				for _, cr := range order {
					run, err := h.restoreOnce(ctx, snaps[cr.Codec], files[cr.Codec], c)
					if err != nil {
						cleanup()
						return fmt.Errorf("%s --codec %s, %s: %w", fx.Name, cr.Codec, c, err)
					}
					cr.Restores[i].Runs = append(cr.Restores[i].Runs, run)
					h.logf("restore %s %-12s %-24s %s run %d/%d: runs %s, touch 1 %s, token %s, all in %s",
						fx.Name, cr.Codec, c.Label(), c.Cache(), r+1, h.runs, ms(run.Running), ms(run.First), ms(run.Token), ms(run.Total))
				}
			}
		}
		h.expect = expectation{}
		cleanup()
		sr.Codecs = append(sr.Codecs, results...)
	}
	return nil
}

// dumpCodec starts fixture fx, learns its answers and dumps it with
// --codec name, then reads the snapshot's figures.
func (h *harness) dumpCodec(ctx context.Context, fx codecFixture, name string) (*codecResult, *snapshot, expectation, error) {
	// The fixture's start-up, its questions and the dump.
	ctx, cancel := context.WithTimeout(ctx, 3*h.opTimeout())
	defer cancel()
	srv, err := startServer(ctx, h.tools, fx.prog(h.tools), h.size, fx.extra, h.logPath, h.work)
	if err != nil {
		return nil, nil, expectation{}, err
	}
	h.live = srv.PID
	h.expect = expectation{}
	if err := h.learn(ctx, srv.Port); err != nil {
		return nil, nil, expectation{}, err
	}
	exp := h.expect
	h.expect = expectation{}
	// modelserver: the weights are a range of its mapping.
	var wlo, whi uint64
	if a, ok := srv.Ready.Fields["addr"]; ok && fx.Name == "modelserver" {
		addr, err1 := strconv.ParseUint(a, 0, 64)
		off, err2 := strconv.ParseUint(srv.Ready.Fields["weights_off"], 10, 64)
		n, err3 := strconv.ParseUint(srv.Ready.Fields["weights_len"], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, nil, expectation{}, fmt.Errorf("modelserver ready line %q: %w", srv.Ready.Text, ErrOutput)
		}
		wlo, whi = addr+off, addr+off+n
	}
	dir := filepath.Join(h.work, "snap-codec-"+fx.Name+"-"+name)
	if err := os.RemoveAll(dir); err != nil {
		return nil, nil, expectation{}, err
	}
	args := []string{"dump", "-t", strconv.Itoa(srv.PID), "-D", dir, "--codec", name}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, h.tools.Snapctl, args...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = &stdout, &stderr, h.work
	if err := cmd.Run(); err != nil {
		return nil, nil, expectation{}, fmt.Errorf("snapctl %q: %w\n%s%s", args, err, stdout.String(), stderr.String())
	}
	if err := srv.waitGone(ctx); err != nil {
		return nil, nil, expectation{}, err
	}
	h.live = 0
	rep, err := parseDump(stdout.String())
	if err != nil {
		return nil, nil, expectation{}, err
	}
	cr := &codecResult{Fixture: fx.Name, Weights: fx.Weights, Codec: name, Dump: rep.Total, Freeze: rep.Freeze}
	if err := readCodecImage(cr, dir, srv.PID, wlo, whi); err != nil {
		return nil, nil, expectation{}, err
	}
	h.logf("dump %s --codec %s: %s; weights %s stored in %s (%.3f)", fx.Name, name, strings.TrimSpace(stdout.String()),
		units.FormatSize(cr.WeightBytes), units.FormatSize(cr.WeightStored), cr.WeightRatio())
	snap := &snapshot{Dir: dir, PID: srv.PID, Port: srv.Port, Pages: filepath.Join(dir, "pages-"+strconv.Itoa(srv.PID)+".img")}
	return cr, snap, exp, nil
}

// readCodecImage fills in cr's figures of the snapshot in dir. The weights are the
// blocks in [wlo, whi) if whi > 0, else the blocks of unnamed anonymous
// mappings of 1 MiB or more (the weightserver's arrays, one mapping each).
func readCodecImage(cr *codecResult, dir string, pid int, wlo, whi uint64) error {
	s, err := image.Open(dir)
	if err != nil {
		return err
	}
	defer s.Close()
	if s.Manifest.Compression != cr.Codec {
		return fmt.Errorf("manifest of --codec %s says %q: %w", cr.Codec, s.Manifest.Compression, ErrInsane)
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
		return fmt.Errorf("%s: no weights found in the snapshot: %w", cr.Fixture, ErrInsane)
	}
	return nil
}

func validateCodecs(runs int, sr *sizeResult, bad func(string, ...any)) {
	for _, c := range sr.Codecs {
		what := c.Fixture + " --codec " + c.Codec
		if c.Memory == 0 || c.Pages == 0 || c.Pages > c.Memory+c.Memory/50 {
			bad("%s: pages file %d for %d bytes of memory", what, c.Pages, c.Memory)
		}
		if c.WeightStored > c.WeightBytes+c.WeightBytes/50 {
			bad("%s: weights stored in %d bytes for %d", what, c.WeightStored, c.WeightBytes)
		}
		if (c.Codec == "lz4") != (c.Shuffled == 0) {
			bad("%s: %d bytes in shuffled blocks", what, c.Shuffled)
		}
		for _, r := range c.Restores {
			if len(r.Runs) != runs {
				bad("%s, %s: %d runs, want %d", what, r.Case, len(r.Runs), runs)
			}
			for _, run := range r.Runs {
				if run.Token <= 0 {
					bad("%s, %s: token at %s", what, r.Case, run.Token)
				}
			}
		}
	}
}

func renderCodecs(m *md, sr *sizeResult) {
	if len(sr.Codecs) == 0 {
		return
	}
	m.p("### Block codecs on model weights")
	m.p("")
	m.p("`snapctl dump --codec` on the modelserver (bf16 weights of N(0, 0.02): half its mapping) and the weightserver (float32 weights of N(0, 0.02) in 16 MiB arrays, with numpy's MADV_HUGEPAGE), each dumped once per codec. *weights* is the stored bytes of the blocks holding the weights over their memory; *token* is the time from the restore command's start to the answer of `token` (after `ping` and `touch 1`), which reads every weight: medians of the runs (range), the codecs restored back to back within each round.")
	m.p("")
	cases := codecCases(false)
	cells := []string{"fixture", "codec", "image", "pages/memory", "weights", "dump", "frozen"}
	for _, c := range cases {
		cells = append(cells, "token, "+c.Label()+" "+c.Cache())
	}
	m.header(cells...)
	for _, c := range sr.Codecs {
		row := []string{c.Fixture + " (" + c.Weights + ")", "`" + c.Codec + "`", units.FormatSize(c.Pages),
			fmt.Sprintf("%.3f", float64(c.Pages)/float64(c.Memory)), fmt.Sprintf("%.3f", c.WeightRatio()),
			summarize([]time.Duration{c.Dump}).String(), summarize([]time.Duration{c.Freeze}).String()}
		for _, k := range cases {
			if r := c.find(k); r != nil {
				row = append(row, r.dist(tokenOf).String())
			} else {
				row = append(row, "—")
			}
		}
		m.row(row...)
	}
	m.p("")
}
