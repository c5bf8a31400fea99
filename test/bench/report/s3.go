package report

import (
	"fmt"
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
)

// S3Result is the series of one size.
type S3Result struct {
	Pages     uint64      // the pages file
	DumpDisk  *DumpResult // Wall, Total, Freeze
	DumpStore *DumpResult
	Restores  []*S3Restore
	Put, Get  []time.Duration // the pages file alone, to and from the store
	DiskRead  []time.Duration // the pages file read from the disk, warm
}

// S3Restore is the lazy restores from one source.
type S3Restore struct {
	From string // S3Sources
	RestoreResult
}

// S3Sources are where the lazy restores read from.
var S3Sources = []string{"disk", "MinIO", "MinIO, --cache-dir filled"}

func validateS3(runs int, sr *SizeResult, bad func(string, ...any)) {
	x := sr.S3
	if x == nil {
		return
	}
	for _, d := range []*DumpResult{x.DumpDisk, x.DumpStore} {
		if len(d.Total) != runs || len(d.Freeze) != runs {
			bad("s3: %d dumps, want %d", len(d.Total), runs)
		}
	}
	if len(x.Restores) != len(S3Sources) {
		bad("s3: %d restore sources, want %d", len(x.Restores), len(S3Sources))
	}
	for _, r := range x.Restores {
		if len(r.Runs) != runs {
			bad("s3: restore from %s: %d runs, want %d", r.From, len(r.Runs), runs)
		}
		for i, run := range r.Runs {
			if msg := checkRun(r.Case, run); msg != "" {
				bad("s3: restore from %s run %d: %s", r.From, i, msg)
			}
		}
	}
	if len(x.Put) != runs || len(x.Get) != runs {
		bad("s3: %d/%d runs of the pages file alone, want %d", len(x.Put), len(x.Get), runs)
	}
}

func renderS3(m *md, sr *SizeResult) {
	x := sr.S3
	if x == nil {
		return
	}
	m.p("### s3: snapshots in an object store (MinIO on loopback) against the disk")
	m.p("")
	m.p("The modelserver of %s dumped with the default option to the disk and to a MinIO server on loopback (`s3://`, same machine, its data on the same disk), back to back in alternating order, then restored with `--lazy` through the private mount from each; the cache directory was filled once beforehand by `snapctl verify --cache-dir`. Medians of %d runs (min–max).",
		units.FormatSize(sr.Size), len(x.DumpDisk.Total))
	m.p("")
	m.header("dump", "disk", "MinIO", "MinIO / disk")
	ratio := func(a, b Dist) string {
		if !a.Valid() || !b.Valid() || a.Med <= 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f×", b.Med.Seconds()/a.Med.Seconds())
	}
	for _, row := range []struct {
		name string
		f    func(*DumpResult) []time.Duration
	}{{"total (snapctl's \"in\")", func(d *DumpResult) []time.Duration { return d.Total }}, {"process frozen", func(d *DumpResult) []time.Duration { return d.Freeze }}} {
		a, b := Summarize(row.f(x.DumpDisk)), Summarize(row.f(x.DumpStore))
		m.row(row.name, a.String(), b.String(), ratio(a, b))
	}
	m.p("")
	m.header("lazy restore from", "process runs", "ping answered", "`touch 1` answered", "`token` answered", "all memory in", "command exits")
	for _, r := range x.Restores {
		rr := &r.RestoreResult
		m.row(r.From, cell(rr, runningOf), cell(rr, pingOf), cell(rr, firstOf), cell(rr, tokenOf), cell(rr, totalOf), cell(rr, wallOf))
	}
	m.p("")
	tput := func(ds []time.Duration) string {
		d := Summarize(ds)
		if !d.Valid() || d.Med <= 0 {
			return "—"
		}
		return fmt.Sprintf("%s (%.0f MiB/s)", d, float64(x.Pages)/(1<<20)/d.Med.Seconds())
	}
	m.p("The floor: the pages file alone (%s), written to the store as a dump writes it (16 MiB parts, four at once) and read back as a sequential reader reads it (1 MiB reads, ranged GETs with readahead), against reading it from the disk with the page cache warm:", units.FormatSize(x.Pages))
	m.p("")
	m.header("pages file alone", "time (throughput)")
	m.row("written to MinIO", tput(x.Put))
	m.row("read from MinIO", tput(x.Get))
	m.row("read from the disk, warm", tput(x.DiskRead))
	m.p("")
}
