package lazy

import (
	"testing"

	"github.com/lazyfs/lazyfs/engine/uffd"
)

// TestStatsAdd: the figures of a tree's pagers add up, and the tree
// exited only if every process did.
func TestStatsAdd(t *testing.T) {
	s := Stats{Exited: true}
	s.add(uffd.Stats{Faults: 2, FaultBytes: 8192, Exited: true})
	if !s.Exited {
		t.Error("one process that exited: the tree did not")
	}
	s.add(uffd.Stats{Faults: 1, PrefetchBytes: 4096})
	if s.Faults != 3 || s.FaultBytes != 8192 || s.PrefetchBytes != 4096 || s.Exited {
		t.Errorf("added %+v", s)
	}
}
