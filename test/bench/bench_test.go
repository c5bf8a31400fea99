package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
	"github.com/lazyfs/lazyfs/test/bench/chart"
	"github.com/lazyfs/lazyfs/test/bench/harness"
	"github.com/lazyfs/lazyfs/test/bench/report"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// smokeTimeout bounds the whole smoke run, as a backstop only: it runs
// every series of the report (some 20 dumps and 70 restores, MinIO,
// replicas, pre-copy), 105-130 s alone on a 2-vCPU machine of the kind
// whose first touch of a page is slow, and about twice that beside the
// end-to-end package's tests. A hang is caught sooner, where it happens:
// every dump, restore and baseline command is bounded by
// Harness.OpTimeout, and a server's start by measure's serverReadyTimeout.
const smokeTimeout = 10 * time.Minute

// TestSmoke runs the whole harness at 64 MiB with one run, as make
// bench-smoke does, and checks that every row of the report is there and
// every figure plausible, so that the harness cannot rot unnoticed.
func TestSmoke(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	testutil.RequireCommand(t, "gcc", "lz4", "cat", "go")

	ctx, cancel := context.WithTimeout(t.Context(), smokeTimeout)
	defer cancel()
	out := t.TempDir()
	var log bytes.Buffer
	o := options{Sizes: []uint64{smokeSize}, Runs: 1, Out: out, Work: t.TempDir(), Smoke: true, Log: &log, Now: time.Now}
	rep, err := measureAll(ctx, o)
	if err != nil {
		t.Fatalf("measure: %v\n%s", err, log.String())
	}
	if err := report.Validate(rep); err != nil {
		t.Fatalf("validate: %v\n%s", err, log.String())
	}
	if err := report.Write(out, rep); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, out, rep)
}

// TestRender checks the report and charts of a synthetic measurement with
// several runs, without privileges.
func TestRender(t *testing.T) {
	rep := fakeReport(3, smokeSize, 1<<30)
	if err := report.Validate(rep); err != nil {
		t.Fatalf("validate a plausible report: %v", err)
	}
	out := t.TempDir()
	if err := report.Write(out, rep); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, out, rep)
	md, _ := os.ReadFile(filepath.Join(out, report.ReportName))
	if !strings.Contains(string(md), "median (min–max) of 3 runs") {
		t.Error("report does not say how many runs a figure summarises")
	}
	// The results file renders the same report again.
	again, err := report.Read(filepath.Join(out, report.ResultsName))
	if err != nil {
		t.Fatal(err)
	}
	md2, _ := report.Render(again)
	if md2, err = report.WithNotes(md2); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(md, md2) {
		t.Error("the report rendered from the results file differs")
	}
}

// TestValidateRejects checks that validate catches missing and impossible
// figures.
func TestValidateRejects(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(*report.Report)
	}{
		{"no sizes", func(r *report.Report) { r.Sizes = nil }},
		{"missing restore", func(r *report.Report) { r.Sizes[0].Restores = r.Sizes[0].Restores[1:] }},
		{"missing run", func(r *report.Report) { r.Sizes[0].Restores[0].Runs = r.Sizes[0].Restores[0].Runs[1:] }},
		{"answers out of order", func(r *report.Report) {
			for _, x := range r.Sizes[0].Restores {
				if !x.Case.Idle {
					x.Runs[0].First = x.Runs[0].Token + time.Millisecond
					return
				}
			}
		}},
		{"frozen longer than the dump", func(r *report.Report) { r.Sizes[0].Dumps[2].Freeze[0] = time.Hour }},
		{"compression grew the image", func(r *report.Report) { r.Sizes[0].Dumps[2].Pages = r.Sizes[0].Dumps[0].Pages + 1 }},
		{"missing lz4 baseline", func(r *report.Report) {
			s := r.Sizes[0]
			for i, b := range s.Baselines {
				if b.Kind == report.LZ4Decode {
					s.Baselines = append(s.Baselines[:i], s.Baselines[i+1:]...)
					return
				}
			}
		}},
		{"zero time", func(r *report.Report) { r.Sizes[0].Baselines[0].Warm[0] = 0 }},
		{"missing weightserver", func(r *report.Report) { r.Sizes[0].Weights = r.Sizes[0].Weights[:1] }},
		{"hg lost in a restore", func(r *report.Report) { r.Sizes[0].Weights[0].Restores[2].Runs[0].HugeVMAs = 0 }},
		{"touch 1 answered in a token-first run", func(r *report.Report) {
			for _, x := range r.Sizes[0].Weights[0].Restores {
				if x.Case.TokenFirst {
					x.Runs[0].First = x.Runs[0].Ping + time.Millisecond
					return
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := fakeReport(2, smokeSize)
			tc.break_(rep)
			if err := report.Validate(rep); !errors.Is(err, report.ErrInsane) {
				t.Errorf("validate = %v, want ErrInsane", err)
			}
		})
	}
}

// checkFiles checks the report's rows and charts in dir.
func checkFiles(t *testing.T, dir string, rep *report.Report) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, report.ReportName))
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	for _, want := range []string{"## Machine", "| CPU |", "| Kernel |", "| Memory |", "| Go (snapctl built with) |", "| Free page reporting |", "| Memory pre-touched |", "## How it is measured"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, s := range rep.Sizes {
		checkRows(t, md, s)
		for _, name := range chartNames3(s.Size) {
			if !strings.Contains(md, "]("+name+")") {
				t.Errorf("report does not embed %s", name)
			}
			svg, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Error(err)
				continue
			}
			checkSVG(t, name, svg)
		}
	}
}

func chartNames3(size uint64) []string {
	a, b, c := report.ChartNames(size)
	return []string{a, b, c}
}

// checkRows checks that every table row of a size is present once per
// table and has no missing figure except where none is expected.
func checkRows(t *testing.T, md string, s *report.SizeResult) {
	t.Helper()
	section := md
	if i := strings.Index(md, "## "+report.SizeTitle(s.Size)+"\n"); i >= 0 {
		section = md[i:]
		if j := strings.Index(section[3:], "\n## "); j >= 0 {
			section = section[:j+3]
		}
	} else {
		t.Fatalf("no section for %d bytes", s.Size)
	}
	rows := strings.Split(section, "\n")
	find := func(prefix string, cells int) []string {
		var got []string
		for _, r := range rows {
			if strings.HasPrefix(r, prefix) && strings.Count(r, " | ")+1 == cells {
				got = append(got, r)
			}
		}
		return got
	}
	expect := func(prefix string, cells, dashes int) {
		t.Helper()
		got := find(prefix, cells)
		if len(got) != 1 {
			t.Errorf("%d rows %q with %d cells, want 1", len(got), prefix, cells)
			return
		}
		n := 0
		for _, c := range strings.Split(strings.Trim(got[0], "| "), " | ") {
			if c == "—" {
				n++
			}
		}
		if n != dashes {
			t.Errorf("row %q: %d missing figures, want %d", got[0], n, dashes)
		}
	}
	for _, cfg := range report.DumpConfigs() {
		nc := 0
		if !cfg.Compress {
			nc = 1
		}
		expect("| "+cfg.Label()+" |", 7, nc)                          // size and dump
		expect("| "+cfg.Label()+" |", 9, 0)                           // restore by block size
		expect("| read pages file (`cat`) | "+cfg.Label()+" |", 6, 0) // baseline
		if cfg.Compress {
			expect("| `lz4 -d`, "+units.FormatSize(uint64(cfg.Block))+" blocks | "+cfg.Label()+" |", 6, 0)
		}
		if cfg.Default {
			expect("| `lz4 -d`, "+units.FormatSize(uint64(cfg.Block))+" blocks, content checksum | "+cfg.Label()+" |", 6, 0)
		}
	}
	for _, c := range report.LatencyCases() {
		dashes := 0
		if !c.Lazy() {
			dashes = 1 // faults
		}
		expect("| "+c.Label()+" | "+c.Cache()+" |", 9, dashes)
	}
	for _, th := range []string{"0 (automatic) (default)", "1", "2"} {
		expect("| "+th+" |", 8, 0)
	}
	if s.Huge != nil {
		for i, c := range report.HugeCases() {
			expect("| "+c.Label()+" |", 7, map[bool]int{true: 0, false: 1}[i == 0]) // the dump is the first row's
		}
	}
	if tr := s.Torch; tr != nil {
		expect("| dump |", 3, map[bool]int{true: 0, false: 1}[tr.CRIUUsed])
		expect("| process frozen |", 3, 1)
		for _, c := range report.TorchCases(tr.CRIUUsed) {
			dashes := 0 // lazy
			switch {
			case c.CRIU:
				dashes = 3 // running after, all memory in, faults
			case c.Label == "eager":
				dashes = 2 // running after, faults
			}
			expect("| "+c.Label+" | "+report.ColdName(c.Cold)+" |", 8, dashes)
		}
	}
	for _, c := range report.WeightCases() {
		for _, advice := range report.WeightAdvices {
			expect("| "+c.Label()+" | "+c.Cache()+" | "+report.AdviceLabel(advice)+" |", 10, 0)
		}
		expect("| "+c.Label()+" | "+c.Cache()+" |", 6, 0) // ratio
	}
}

// checkSVG checks that svg is well-formed XML with a title and bars.
func checkSVG(t *testing.T, name string, svg []byte) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(svg))
	rects, texts := 0, 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Errorf("%s: not well-formed: %v", name, err)
			return
		}
		if se, ok := tok.(xml.StartElement); ok {
			switch se.Name.Local {
			case "rect":
				rects++
			case "text":
				texts++
			}
		}
	}
	if rects < 3 || texts < 5 {
		t.Errorf("%s: %d rects and %d texts: no chart", name, rects, texts)
	}
	if bytes.Contains(svg, []byte("NaN")) || bytes.Contains(svg, []byte("Inf")) {
		t.Errorf("%s: holds NaN or Inf", name)
	}
}

// fakeReport returns a plausible measurement of the given sizes.
func fakeReport(runs int, sizes ...uint64) *report.Report {
	rep := &report.Report{Runs: runs, Started: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), Elapsed: time.Minute,
		Machine: report.Machine{CPU: "Test CPU", CPUs: 2, Affinity: 2, Kernel: "6.18 x86_64", Memory: 8 << 30, GoVersion: "go1.26", FreePageReporting: "on"}}
	ms := func(n int, r int) time.Duration { return time.Duration(n+10*r) * time.Millisecond }
	for _, size := range sizes {
		s := &report.SizeResult{Size: size, Memory: size + size/8, Elapsed: time.Minute}
		for r := range runs {
			s.Init = append(s.Init, ms(1000, r))
		}
		for i, cfg := range report.DumpConfigs() {
			d := &report.DumpResult{Config: cfg, Pages: s.Memory * 3 / 4, Ratio: 0.75}
			if cfg.Compress {
				d.Pages = s.Memory*2/3 - uint64(i)<<10
				d.Ratio = 0.66
				d.LZ4 = s.Memory * 7 / 10
			}
			d.Image = d.Pages + 4096
			for r := range runs {
				d.Wall = append(d.Wall, ms(900, r))
				d.Total = append(d.Total, ms(880, r))
				d.Freeze = append(d.Freeze, ms(870, r))
			}
			s.Dumps = append(s.Dumps, d)
			for _, c := range report.RestoreCases(cfg) {
				rr := &report.RestoreResult{Config: cfg, Case: c}
				for r := range runs {
					run := report.RestoreRun{Wall: ms(700, r), Running: ms(40, r), Total: ms(650, r), Faults: 100}
					if !c.Lazy() {
						run.Running, run.Total, run.Faults = ms(600, r), ms(600, r), 0
					}
					if !c.Idle {
						run.Ping, run.First, run.Token = ms(50, r), ms(300, r), ms(900, r)
					}
					rr.Runs = append(rr.Runs, run)
				}
				s.Restores = append(s.Restores, rr)
			}
			read := &report.BaselineResult{Config: cfg, Kind: report.ReadPages, Bytes: d.Pages}
			lz := &report.BaselineResult{Config: cfg, Kind: report.LZ4Decode, Bytes: d.LZ4, Output: s.Memory}
			for r := range runs {
				read.Cold, read.Warm = append(read.Cold, ms(500, r)), append(read.Warm, ms(100, r))
				lz.Cold, lz.Warm = append(lz.Cold, ms(600, r)), append(lz.Warm, ms(200, r))
			}
			s.Baselines = append(s.Baselines, read)
			if cfg.Compress {
				s.Baselines = append(s.Baselines, lz)
			}
			if cfg.Default {
				checked := *lz
				checked.Kind = report.LZ4Checked
				s.Baselines = append(s.Baselines, &checked)
			}
		}
		for _, advice := range report.WeightAdvices {
			w := &report.WeightsResult{Advice: advice, Arrays: int(size >> 24), Init: time.Second}
			if advice == "hugepage" {
				w.HugeVMAs, w.AnonHuge = w.Arrays, size-size/8
			}
			for _, c := range report.WeightCases() {
				rr := &report.RestoreResult{Config: report.DefaultConfig(), Case: c}
				for r := range runs {
					run := report.RestoreRun{Wall: ms(700, r), Running: ms(40, r), Total: ms(650, r), Faults: 100, HugeVMAs: w.HugeVMAs,
						Ping: ms(50, r), First: ms(300, r), Token: ms(600, r)}
					if !c.Lazy() {
						run.Running, run.Total, run.Faults, run.Ping, run.First = ms(500, r), ms(500, r), 0, ms(510, r), ms(520, r)
					}
					if c.TokenFirst {
						run.First = 0
					}
					rr.Runs = append(rr.Runs, run)
				}
				w.Restores = append(w.Restores, rr)
			}
			s.Weights = append(s.Weights, w)
		}
		if size == sizes[0] {
			s.Torch = fakeTorch(runs, ms)
			s.Huge = fakeHuge(ms)
		}
		rep.Sizes = append(rep.Sizes, s)
	}
	return rep
}

func TestSummarize(t *testing.T) {
	d := report.Summarize([]time.Duration{5, 1, 3})
	if d != (report.Dist{N: 3, Med: 3, Min: 1, Max: 5}) {
		t.Errorf("odd: %+v", d)
	}
	d = report.Summarize([]time.Duration{4, 1, 2, 8})
	if d != (report.Dist{N: 4, Med: 3, Min: 1, Max: 8}) {
		t.Errorf("even: %+v", d)
	}
	if report.Summarize(nil).Valid() {
		t.Error("empty summary is valid")
	}
	for _, tc := range []struct {
		d    report.Dist
		want string
	}{
		{report.Summarize([]time.Duration{695 * time.Millisecond, 680 * time.Millisecond, 712 * time.Millisecond}), "695 ms (680–712)"},
		{report.Summarize([]time.Duration{2120 * time.Millisecond}), "2.12 s"},
		{report.Summarize([]time.Duration{3500 * time.Microsecond, 3 * time.Millisecond}), "3.2 ms (3.0–3.5)"},
		{report.Dist{}, "—"},
	} {
		if got := tc.d.String(); got != tc.want {
			t.Errorf("String = %q, want %q", got, tc.want)
		}
	}
}

func TestChartSkipsMissingBars(t *testing.T) {
	c := chart.Chart{Title: "t <&>", YLabel: "ms", Categories: []string{"a b c d e f g h", "b"},
		Series: []chart.Series{{Name: "s", Values: []float64{1, math.NaN()}, Lo: []float64{0.5, math.NaN()}, Hi: []float64{2, math.NaN()}}}}
	svg := c.SVG()
	checkSVG(t, "chart", svg)
	if n := bytes.Count(svg, []byte("<title>")); n != 1 {
		t.Errorf("%d bars, want 1", n)
	}
}

// fakeTorch is a plausible torch series, CRIU included.
func fakeTorch(runs int, ms func(n, r int) time.Duration) *report.TorchResult {
	tr := &report.TorchResult{Shape: "12 layers of width 768", Params: 124439808, Weights: 474 << 20, Memory: "589.2 MiB",
		Image: 505 << 20, Maps: 1686, CRIU: "/usr/sbin/criu (Version: 4.2)", CRIUUsed: true, CRIUImage: 589 << 20,
		Restores: report.TorchCases(true)}
	for r := range runs {
		tr.Dump, tr.Freeze, tr.CRIUDump = append(tr.Dump, ms(400, r)), append(tr.Freeze, ms(390, r)), append(tr.CRIUDump, ms(330, r))
		for _, c := range tr.Restores {
			c.Ping, c.Token = append(c.Ping, ms(60, r)), append(c.Token, ms(450, r))
			if c.CRIU {
				continue
			}
			c.AllIn = append(c.AllIn, ms(300, r))
			if c.Label != "eager" {
				c.Running, c.Faults, c.Served = append(c.Running, ms(50, r)), append(c.Faults, 170), append(c.Served, "28 MiB")
			}
		}
	}
	return tr
}

// fakeHuge is a plausible huge series.
func fakeHuge(ms func(n, r int) time.Duration) *report.HugeResult {
	hr := &report.HugeResult{Size: hugeSize, Arrays: 768, Init: 30 * time.Second, Image: hugeSize, Dump: ms(5600, 0), Freeze: ms(5590, 0)}
	for i, c := range report.HugeCases() {
		run := report.RestoreRun{Running: ms(50, 0), Ping: ms(60, 0), Token: ms(9000, 0), Total: ms(8900, 0)}
		if i == 0 {
			run = report.RestoreRun{Running: ms(16000, 0), Ping: ms(16010, 0), Token: ms(16600, 0), Total: ms(16000, 0)}
		}
		hr.Restores = append(hr.Restores, &report.RestoreResult{Config: report.DefaultConfig(), Case: c, Runs: []report.RestoreRun{run}})
	}
	return hr
}

// TestSeriesHaveSections checks that the report has a section for every
// series the harness measures, in the same order.
func TestSeriesHaveSections(t *testing.T) {
	var names []string
	for _, s := range harness.ExtraSeries {
		names = append(names, s.Name)
	}
	if got := report.SectionNames(); !slices.Equal(got, names) {
		t.Errorf("report sections %v, series %v", got, names)
	}
}
