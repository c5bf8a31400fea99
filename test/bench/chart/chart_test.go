package chart_test

import (
	"bytes"
	"math"
	"testing"

	"github.com/lazyfs/lazyfs/test/bench/chart"
	"github.com/lazyfs/lazyfs/test/bench/report/reporttest"
)

func TestChartSkipsMissingBars(t *testing.T) {
	c := chart.Chart{Title: "t <&>", YLabel: "ms", Categories: []string{"a b c d e f g h", "b"},
		Series: []chart.Series{{Name: "s", Values: []float64{1, math.NaN()}, Lo: []float64{0.5, math.NaN()}, Hi: []float64{2, math.NaN()}}}}
	svg := c.SVG()
	reporttest.CheckSVG(t, "chart", svg)
	if n := bytes.Count(svg, []byte("<title>")); n != 1 {
		t.Errorf("%d bars, want 1", n)
	}
}
