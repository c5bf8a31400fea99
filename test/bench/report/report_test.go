package report_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/test/bench/report"
	"github.com/lazyfs/lazyfs/test/bench/report/reporttest"
)

// smokeSize is the fixture size of the harness's smoke run.
const smokeSize = 64 << 20

// TestRender checks the report and charts of a synthetic measurement with
// several runs, without privileges.
func TestRender(t *testing.T) {
	rep := reporttest.FakeReport(3, smokeSize, 1<<30)
	if err := report.Validate(rep); err != nil {
		t.Fatalf("validate a plausible report: %v", err)
	}
	out := t.TempDir()
	if err := report.Write(out, rep); err != nil {
		t.Fatal(err)
	}
	reporttest.CheckFiles(t, out, rep)
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
			rep := reporttest.FakeReport(2, smokeSize)
			tc.break_(rep)
			if err := report.Validate(rep); !errors.Is(err, report.ErrInsane) {
				t.Errorf("validate = %v, want ErrInsane", err)
			}
		})
	}
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
