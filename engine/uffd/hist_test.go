package uffd

import (
	"testing"
	"time"
)

func TestHist(t *testing.T) {
	var h hist
	if h.quantile(0.5) != 0 {
		t.Fatal("empty hist quantile not 0")
	}
	for i := 1; i <= 1000; i++ {
		h.add(time.Duration(i) * time.Microsecond)
	}
	check := func(q float64, want time.Duration) {
		got := h.quantile(q)
		if got < want || float64(got) > float64(want)*1.13 {
			t.Errorf("quantile(%v) = %v, want %v within 13%%", q, got, want)
		}
	}
	check(0.5, 500*time.Microsecond)
	check(0.99, 990*time.Microsecond)
	if h.quantile(1) != time.Millisecond || h.max != time.Millisecond {
		t.Errorf("max %v / q1 %v, want 1ms", h.max, h.quantile(1))
	}
	for i := range 495 {
		if histLower(i+1) <= histLower(i) {
			t.Fatalf("bucket bounds not increasing at %d", i)
		}
		if j := histIndex(histLower(i)); j != i {
			t.Fatalf("histIndex(histLower(%d)) = %d", i, j)
		}
	}
}
