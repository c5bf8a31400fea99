// Package report is the benchmark harness's results and what it makes of
// them: the figures of one run (Report, saved as bench-results.json and
// read back for -render), the checks that they are plausible (Validate),
// and BENCHMARKS.md with its SVG charts (Write). It measures nothing; the
// harness, package main of test/bench, fills a Report.
//
// Each series beyond the modelserver's and the weightserver's has a file
// here with its results type and the section that checks and writes them,
// beside the file of the same name in test/bench that measures it.
package report

import ()
