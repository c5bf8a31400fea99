package report

import (
	"fmt"
	"slices"
	"time"
)

// Dist summarises the runs of one measurement.
type Dist struct {
	N             int
	Med, Min, Max time.Duration
}

// Summarize returns the median (the mean of the middle two for an even
// count), minimum and maximum of ds.
func Summarize(ds []time.Duration) Dist {
	if len(ds) == 0 {
		return Dist{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Dist{N: n, Med: med, Min: s[0], Max: s[n-1]}
}

// Valid reports whether the distribution holds any run.
func (d Dist) Valid() bool { return d.N > 0 }

// String formats the median and, for several runs, the range in the
// median's unit: "695 ms (680–712)", "2.12 s (2.05–2.30)".
func (d Dist) String() string {
	if d.N == 0 {
		return "—"
	}
	unit, scale, prec := unitFor(d.Med)
	med := fmt.Sprintf("%.*f %s", prec, d.Med.Seconds()*scale, unit)
	if d.N == 1 {
		return med
	}
	return fmt.Sprintf("%s (%.*f–%.*f)", med, prec, d.Min.Seconds()*scale, prec, d.Max.Seconds()*scale)
}

// unitFor picks seconds or milliseconds and a precision giving about three
// significant digits.
func unitFor(d time.Duration) (unit string, scale float64, prec int) {
	switch {
	case d >= 10*time.Second:
		return "s", 1, 1
	case d >= time.Second:
		return "s", 1, 2
	case d >= 10*time.Millisecond:
		return "ms", 1e3, 0
	default:
		return "ms", 1e3, 1
	}
}

// rate formats bytes per duration in GB/s (10^9 bytes a second, as disk
// and memory bandwidths are usually quoted).
func rate(bytes uint64, d time.Duration) string {
	if d <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f GB/s", float64(bytes)/d.Seconds()/1e9)
}
