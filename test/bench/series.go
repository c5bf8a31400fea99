package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/lazyfs/lazyfs/test/bench/report"
)

// A series is a part of the harness's measurements of one size beyond
// the modelserver's dumps, restores and baselines ("modelserver", always
// first) and the weightserver's ("weights"): a feature's own benchmark
// (replicas, object store, encryption...), in a file of its own that adds
// itself to extraSeries from an init function. Its results live in a field
// of report.SizeResult it owns, so that -render can write its section again; the
// section of the same name in extraSections checks and writes them.
type series struct {
	Name string // for -only, lower case
	// Measure runs the series for one size and stores its results in sr.
	Measure func(ctx context.Context, h *harness, sr *report.SizeResult) error
}

// builtinSeries are the series measureSize runs itself, in this order.
var builtinSeries = []string{"modelserver", "weights"}

// extraSeries are the other series, run in this order after the built-in.
var extraSeries []series

// seriesNames returns every series name, in the order they run.
func seriesNames() []string {
	names := slices.Clone(builtinSeries)
	for _, s := range extraSeries {
		names = append(names, s.Name)
	}
	return names
}

// parseOnly checks a comma-separated -only list against the series names.
func parseOnly(v string) ([]string, error) {
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

// wants reports whether series name is measured: every series unless
// -only names some.
func (h *harness) wants(name string) bool {
	return len(h.only) == 0 || slices.Contains(h.only, name)
}
