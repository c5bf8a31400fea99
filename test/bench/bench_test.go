package main

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/test/bench/harness"
	"github.com/lazyfs/lazyfs/test/bench/report"
	"github.com/lazyfs/lazyfs/test/bench/report/reporttest"
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
	reporttest.CheckFiles(t, out, rep)
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

// TestRecordedAny: a pre-fork server's working sets may all be empty;
// one page in any of them makes the working-set cases check their use.
func TestRecordedAny(t *testing.T) {
	for _, tc := range []struct {
		recorded string
		want     bool
	}{
		{"0 B in 0 ranges over 18ms (stopped by signal)", false},
		{"0 B in 0 ranges over 18ms (stopped by signal); 0 B in 0 ranges over 1ms (stopped by signal)", false},
		{"0 B in 0 ranges over 18ms (stopped by signal); 4 KiB in 1 ranges over 2ms (stopped by signal)", true},
		{"1.3 MiB in 168 ranges over 23ms (stopped by signal)", true},
	} {
		if got := recordedAny(tc.recorded); got != tc.want {
			t.Errorf("recordedAny(%q) = %v, want %v", tc.recorded, got, tc.want)
		}
	}
}
