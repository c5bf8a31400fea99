package harness

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/lazyfs/lazyfs/test/bench/report"
)

// A Series is a part of the harness's measurements of one size beyond
// the modelserver's dumps, restores and baselines ("modelserver", always
// first) and the weightserver's ("weights"): a feature's own benchmark
// (replicas, object store, encryption...), in a file of package main of
// test/bench that adds itself to ExtraSeries from an init function. Its
// results live in a field of report.SizeResult it owns, so that -render
// can write its section again; the report's section of the same name
// checks and writes them.
type Series struct {
	Name string // for -only, lower case
	// Measure runs the series for one size and stores its results in sr.
	Measure func(ctx context.Context, h *Harness, sr *report.SizeResult) error
}

// builtinSeries are the series MeasureSize runs itself, in this order.
var builtinSeries = []string{"modelserver", "weights"}

// ExtraSeries are the other series, run in this order after the built-in.
var ExtraSeries []Series

// seriesNames returns every series name, in the order they run.
func seriesNames() []string {
	names := slices.Clone(builtinSeries)
	for _, s := range ExtraSeries {
		names = append(names, s.Name)
	}
	return names
}

// ParseOnly checks a comma-separated -only list against the series names.
func ParseOnly(v string) ([]string, error) {
	if v == "" {
		return nil, nil
	}
	var out []string
	for _, n := range strings.Split(v, ",") {
		if !slices.Contains(seriesNames(), n) {
			return nil, fmt.Errorf("-only %q: no series %q (have %s)", v, n, strings.Join(seriesNames(), ", "))
		}
		out = append(out, n)
	}
	return out, nil
}

// Wants reports whether series name is measured: every series unless
// -only names some.
func (h *Harness) Wants(name string) bool {
	return len(h.Only) == 0 || slices.Contains(h.Only, name)
}
