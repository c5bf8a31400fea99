package precopy

import (
	"reflect"
	"testing"

	"github.com/lazyfs/lazyfs/engine/units"
)

func TestRangeSet(t *testing.T) {
	r := func(a, b uint64) units.Range { return units.Range{Start: a, End: b} }
	var s rangeSet
	s.add(r(10, 20))
	s.add(r(30, 40))
	s.add(r(20, 25)) // touches: merges
	if want := (rangeSet{r(10, 25), r(30, 40)}); !reflect.DeepEqual(s, want) {
		t.Fatalf("after adds: %v, want %v", s, want)
	}
	s.add(r(24, 31)) // bridges
	if want := (rangeSet{r(10, 40)}); !reflect.DeepEqual(s, want) {
		t.Fatalf("after bridge: %v, want %v", s, want)
	}
	s.sub(r(15, 18))
	s.sub(r(35, 50))
	if want := (rangeSet{r(10, 15), r(18, 35)}); !reflect.DeepEqual(s, want) {
		t.Fatalf("after subs: %v, want %v", s, want)
	}
	if g, want := s.gaps(5, 40), []units.Range{r(5, 10), r(15, 18), r(35, 40)}; !reflect.DeepEqual(g, want) {
		t.Errorf("gaps %v, want %v", g, want)
	}
	if g := s.gaps(11, 14); g != nil {
		t.Errorf("gaps inside a range: %v", g)
	}
	if !s.covers(18, 35) || s.covers(14, 19) {
		t.Errorf("covers wrong on %v", s)
	}
	s.sub(r(0, 100))
	if len(s) != 0 {
		t.Errorf("after removing all: %v", s)
	}
}
