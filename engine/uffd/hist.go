package uffd

import (
	"math/bits"
	"time"
)

// hist is a latency histogram: nanoseconds in buckets of 1/8 of a power of
// two (about 12% resolution), enough for p50/p99 of fault service times.
type hist struct {
	n      uint64
	max    time.Duration
	bucket [64 * 8]uint64
}

func histIndex(ns uint64) int {
	if ns < 8 {
		return int(ns)
	}
	e := bits.Len64(ns) - 1 // ns in [2^e, 2^(e+1))
	sub := (ns >> (e - 3)) & 7
	return e*8 + int(sub) - 16 // e>=3: 3*8+0-16 = 8
}

// histLower is the smallest value of bucket i.
func histLower(i int) uint64 {
	if i < 8 {
		return uint64(i)
	}
	i += 16
	e, sub := i/8, uint64(i%8)
	return (8 + sub) << (e - 3)
}

func (h *hist) add(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.n++
	if d > h.max {
		h.max = d
	}
	i := histIndex(uint64(d))
	if i >= len(h.bucket) {
		i = len(h.bucket) - 1
	}
	h.bucket[i]++
}

// quantile returns the upper edge of the bucket holding quantile q (0..1),
// capped at the maximum seen.
func (h *hist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.5)
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i, c := range h.bucket {
		seen += c
		if seen >= rank {
			d := time.Duration(histLower(i + 1))
			return min(d, h.max)
		}
	}
	return h.max
}
