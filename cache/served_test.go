package cache

import (
	"bytes"
	"sync/atomic"
	"testing"
)

// TestServed: a block leaves the LRU once every page of it was served,
// whatever the order and overlap of the ranges; ranges that cover part of
// a page do not count that page; a Ref held across the drop keeps its
// bytes; a reload starts with nothing served.
func TestServed(t *testing.T) {
	c := New(1 << 20)
	f := c.NewFile()
	k := Key{File: f, Block: 1}
	const size = 5*pageSize + 100 // a short last page
	r := get(t, c, k, size, fill(k, nil))
	check := func(what string, entries, served int64) {
		t.Helper()
		s := c.Stats()
		if s.Entries != entries || s.Served != served {
			t.Fatalf("%s: %+v, want %d entries, %d served", what, s, entries, served)
		}
	}
	r.Served(0, 2*pageSize)
	r.Served(pageSize, 2*pageSize) // again
	check("two pages served", 1, 0)
	r.Served(2*pageSize+1, 4*pageSize) // page 2 only in part: page 3
	check("page 2 in part", 1, 0)
	r.Served(4*pageSize, size) // pages 4 and the short 5
	check("all but page 2", 1, 0)
	r.Served(2*pageSize, 3*pageSize)
	check("every page", 0, 1)
	if s := c.Stats(); s.Bytes != 0 {
		t.Fatalf("%d bytes counted with no entry", s.Bytes)
	}
	if !bytes.Equal(r.Bytes(), want(k, size)) {
		t.Fatal("a held Ref's bytes changed when its block was dropped")
	}
	r.Served(0, size) // after the drop: nothing more happens
	check("served again", 0, 1)
	r.Release()

	var calls atomic.Int64
	r = get(t, c, k, size, fill(k, &calls))
	if calls.Load() != 1 {
		t.Fatal("a dropped block was not loaded again")
	}
	r.Served(0, pageSize)
	check("reloaded, one page served", 1, 1)
	r.Release()

	// An entry evicted and loaded again under the same key is not the
	// one an old Ref serves.
	old := get(t, c, k, size, fill(k, nil))
	for i := range 40 {
		kk := Key{File: f, Block: uint64(100 + i)}
		get(t, c, kk, blk, fill(kk, nil)).Release()
	}
	if _, ok := c.Peek(k); ok {
		t.Fatal("block not evicted; the test proves nothing")
	}
	fresh := get(t, c, k, size, fill(k, nil))
	old.Served(0, size)
	if r, ok := c.Peek(k); !ok {
		t.Fatal("serving an evicted entry dropped the fresh one")
	} else {
		r.Release()
	}
	fresh.Release()
	old.Release()
}
