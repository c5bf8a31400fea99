package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
	"github.com/lazyfs/lazyfs/test/bench/harness"
	"github.com/lazyfs/lazyfs/test/bench/report"
)

// Defaults of the full run and of the smoke run.
const (
	defaultSize = 1 << 30
	largeSize   = 4 << 30
	smokeSize   = 64 << 20
	defaultRuns = 5
)

// LargeEnv set to 1 adds the large size, like -large.
const LargeEnv = "BENCH_LARGE"

// options are the harness's settings.
type options struct {
	Sizes  []uint64  // memory sizes of the fixture, in order
	Runs   int       // runs per measurement
	Out    string    // directory for BENCHMARKS.md and the charts
	Bin    string    // directory with snapctl and lazyfs; empty: go build
	Work   string    // parent of the work directory (snapshots, logs)
	Smoke  bool      // the CI run
	Render string    // re-render the report from this results file instead of measuring
	Only   []string  // series to measure (-only); empty: all of them
	Huge   bool      // -huge: the 12 GiB weightserver too
	Log    io.Writer // progress, one line per run
	Now    func() time.Time
}

// sizeFlag is a byte size flag with K/M/G suffixes.
type sizeFlag struct{ v uint64 }

func (s *sizeFlag) String() string { return units.FormatSize(s.v) }

func (s *sizeFlag) Set(v string) error {
	n, err := units.ParseSize(v)
	if err != nil {
		return err
	}
	if n <= 0 {
		return errors.New("size must be positive")
	}
	s.v = uint64(n)
	return nil
}

// parseOptions turns command-line arguments into options.
func parseOptions(args []string, stderr io.Writer) (options, error) {
	fl := flag.NewFlagSet("bench", flag.ContinueOnError)
	fl.SetOutput(stderr)
	size := sizeFlag{v: defaultSize}
	fl.Var(&size, "size", "memory `SIZE` of the modelserver fixture (K, M, G suffixes; at most 8G)")
	runs := fl.Int("runs", defaultRuns, "runs per measurement; the report gives their median and min–max")
	out := fl.String("out", "", "directory for BENCHMARKS.md and the SVG charts (default test/bench of the module)")
	large := fl.Bool("large", os.Getenv(LargeEnv) == "1", "also measure a 4 GiB fixture (default from "+LargeEnv+"=1)")
	huge := fl.Bool("huge", os.Getenv(HugeEnv) == "1", "also dump and restore a 12 GiB weightserver once (default from "+HugeEnv+"=1; needs ~13 GiB of free memory and ~13 GiB of disk)")
	smoke := fl.Bool("smoke", false, "CI smoke run: 64 MiB and 1 run unless -size/-runs say otherwise")
	bin := fl.String("bin", "", "directory holding snapctl and lazyfs built from this module (default: go build them)")
	render := fl.String("render", "", "write the report and charts from a results `FILE` ("+report.ResultsName+") instead of measuring")
	only := fl.String("only", "", "measure only these comma-separated `SERIES` (modelserver, weights, and those of features); needs -out, since the report is then partial")
	work := fl.String("work", "", "parent `DIR` of the work directory holding snapshots (default $TMPDIR); it needs about 3x -size free")
	if err := fl.Parse(args); err != nil {
		return options{}, err
	}
	if fl.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments %q", fl.Args())
	}
	set := map[string]bool{}
	fl.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *smoke {
		if !set["size"] {
			size.v = smokeSize
		}
		if !set["runs"] {
			*runs = 1
		}
	}
	if *runs < 1 {
		return options{}, fmt.Errorf("-runs %d: want at least 1", *runs)
	}
	onlyList, err := harness.ParseOnly(*only)
	if err != nil {
		return options{}, err
	}
	if len(onlyList) > 0 && *out == "" {
		return options{}, errors.New("-only writes a partial report: give -out DIR, so that test/bench/BENCHMARKS.md is not overwritten")
	}
	if size.v < 16<<20 || size.v > 8<<30 {
		return options{}, fmt.Errorf("-size %s: want 16 MiB to 8 GiB", units.FormatSize(size.v))
	}
	o := options{Sizes: []uint64{size.v}, Runs: *runs, Out: *out, Bin: *bin, Work: *work, Smoke: *smoke, Render: *render, Only: onlyList, Log: stderr, Now: time.Now, Huge: *huge}
	if *large && size.v != largeSize {
		o.Sizes = append(o.Sizes, largeSize)
	}
	if o.Out == "" {
		root, err := report.ModuleRoot()
		if err != nil {
			return options{}, err
		}
		o.Out = filepath.Join(root, "test", "bench")
	}
	return o, nil
}
