// Package reporttest holds what the benchmark report's tests share with
// the harness's: a plausible synthetic Report, and checks of a written
// BENCHMARKS.md and its charts.
package reporttest

import (
	"bytes"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
	"github.com/lazyfs/lazyfs/test/bench/report"
)

// hugeSize is the huge series' weightserver, as the harness runs it.
const hugeSize = 12 << 30

// FakeReport returns a plausible measurement of the given sizes.
func FakeReport(runs int, sizes ...uint64) *report.Report {
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
		s.Weights = fakeWeights(runs, size, ms)
		if size == sizes[0] {
			s.Torch = fakeTorch(runs, ms)
			s.Huge = fakeHuge(ms)
		}
		rep.Sizes = append(rep.Sizes, s)
	}
	return rep
}

// fakeWeights is a plausible weightserver series of a size.
func fakeWeights(runs int, size uint64, ms func(n, r int) time.Duration) []*report.WeightsResult {
	var ws []*report.WeightsResult
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
		ws = append(ws, w)
	}
	return ws
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

// CheckFiles checks the report's rows and charts in dir.
func CheckFiles(t testing.TB, dir string, rep *report.Report) {
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
			CheckSVG(t, name, svg)
		}
	}
}

func chartNames3(size uint64) []string {
	a, b, c := report.ChartNames(size)
	return []string{a, b, c}
}

// checkRows checks that every table row of a size is present once per
// table and has no missing figure except where none is expected.
func checkRows(t testing.TB, md string, s *report.SizeResult) {
	t.Helper()
	rows := sectionRows(t, md, s.Size)
	expect := func(prefix string, cells, dashes int) {
		t.Helper()
		expectRow(t, rows, prefix, cells, dashes)
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

// sectionRows returns the lines of the report's section of a size.
func sectionRows(t testing.TB, md string, size uint64) []string {
	t.Helper()
	section := md
	if i := strings.Index(md, "## "+report.SizeTitle(size)+"\n"); i >= 0 {
		section = md[i:]
		if j := strings.Index(section[3:], "\n## "); j >= 0 {
			section = section[:j+3]
		}
	} else {
		t.Fatalf("no section for %d bytes", size)
	}
	return strings.Split(section, "\n")
}

// expectRow checks that one of rows, and only one, starts with prefix and
// has cells cells, dashes of them "—" (no figure).
func expectRow(t testing.TB, rows []string, prefix string, cells, dashes int) {
	t.Helper()
	var got []string
	for _, r := range rows {
		if strings.HasPrefix(r, prefix) && strings.Count(r, " | ")+1 == cells {
			got = append(got, r)
		}
	}
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

// CheckSVG checks that svg is well-formed XML with a title and bars.
func CheckSVG(t testing.TB, name string, svg []byte) {
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
