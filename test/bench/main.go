// Command bench is the lazyfs benchmark harness behind `make bench`: the
// numbers users of snapshot-based serving choose a tool by, snapshot size
// and restore to first response, measured on the modelserver fixture
// (test/fixtures/modelserver.c) and written to BENCHMARKS.md with SVG charts.
//
// For each memory size (1 GiB by default, 4 GiB too with -large) it dumps
// the fixture with every compression option, restores each snapshot eagerly
// and lazily with the page cache dropped (cold) and kept (warm), and times
// the baselines a restore should be judged against: reading the pages file
// and decompressing the same memory with the lz4 command-line tool. Then it
// dumps the weightserver fixture (test/fixtures/weightserver.c: weights in
// arrays advised MADV_HUGEPAGE, as numpy lays them out) of the same size
// with and without the advice and restores both alike. Every
// figure is the median and min–max of -runs runs. The report explains each
// measurement; read it, or report/report.go, before quoting a number.
//
// Usage, as root (dump and restore trace processes; cold runs drop the
// page cache):
//
//	go run ./test/bench [-size 1G] [-runs 5] [-large] [-out DIR] [-bin DIR] [-smoke]
//
// -bin names a directory holding snapctl and lazyfs built from this module;
// without it the harness builds them with `go build` into its work
// directory. -smoke is the CI run: 64 MiB, one run, every row of the report.
//
// Package harness (test/bench/harness) runs the modelserver and
// weightserver series and the steps every series shares; this package
// holds the options and the other series, each in a file of its own;
// package measure the instruments they use; package report the results,
// their checks, BENCHMARKS.md and its charts.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/lazyfs/lazyfs/test/bench/report"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run parses args, measures and writes the report.
func run(ctx context.Context, args []string) error {
	opts, err := parseOptions(args, os.Stderr)
	if err != nil {
		return err
	}
	var rep *report.Report
	if opts.Render != "" {
		rep, err = report.Read(opts.Render)
	} else {
		rep, err = measureAll(ctx, opts)
	}
	if err != nil {
		return err
	}
	if err := report.Validate(rep); err != nil {
		return fmt.Errorf("report not written: %w", err)
	}
	if err := report.Write(opts.Out, rep); err != nil {
		return err
	}
	fmt.Fprintf(opts.Log, "bench: wrote %s\n", filepath.Join(opts.Out, report.ReportName))
	return nil
}
