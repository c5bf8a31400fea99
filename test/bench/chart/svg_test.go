package chart

import (
	"math"
	"testing"
)

func TestNiceScale(t *testing.T) {
	for _, max := range []float64{0.003, 0.7, 1, 9.9, 123, 1500, 4e6} {
		top, step := niceScale(max)
		if top < max || top > max*2.5 || step <= 0 || top/step > 12 || top/step < 3 {
			t.Errorf("niceScale(%g) = %g, %g", max, top, step)
		}
	}
	for _, tc := range []struct {
		v, step float64
		want    string
	}{
		{0.6000000000000001, 0.2, "0.6"},
		{0.30000000000000004, 0.05, "0.30"},
		{1500, 500, "1500"},
		{0.004, 0.001, "0.004"},
	} {
		if got := tickLabel(tc.v, tc.step); got != tc.want {
			t.Errorf("tickLabel(%g, %g) = %q, want %q", tc.v, tc.step, got, tc.want)
		}
	}
	if top, _ := niceScale(math.NaN()); top != 1 {
		t.Errorf("niceScale(NaN) top = %g", top)
	}
}
