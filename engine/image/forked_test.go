package image

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/lazyfs/lazyfs/engine/codec"
)

// treeProc is one process of a synthetic tree snapshot: its memory, its
// parent, and the part of its memory it shares with the parent (Forked).
type treeProc struct {
	pid, ppid int
	ranges    []memRange
	shared    func(addr, n uint64) bool // nil: none
	statePPID int                       // the state's ppid, if not ppid
}

// writeTree writes procs, parents first, as a tree snapshot in dir.
func writeTree(t *testing.T, dir string, procs []treeProc, opts Options) map[int]Stats {
	t.Helper()
	w, err := Create(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	w.MarkTree()
	stats := map[int]Stats{}
	for _, p := range procs {
		if p.shared != nil {
			w.Forked(p.pid, p.ppid, p.shared)
		}
		pw, err := w.Pages(context.Background(), p.pid)
		if err != nil {
			t.Fatal(err)
		}
		for _, mr := range p.ranges {
			if mr.brk {
				pw.Break()
			}
			if err := pw.Add(mr.addr, uint64(len(mr.data)), func(dst []byte, a uint64) error {
				copy(dst, mr.data[a-mr.addr:])
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		if err := pw.Close(); err != nil {
			t.Fatal(err)
		}
		stats[p.pid] = pw.Stats()
		ppid := p.ppid
		if p.statePPID != 0 {
			ppid = p.statePPID
		}
		if err := w.WriteState(&Process{PID: p.pid, PPID: ppid, Comm: "synth", Threads: []Thread{{TID: p.pid}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	return stats
}

// everywhere shares all memory.
func everywhere(uint64, uint64) bool { return true }

// TestForkedBlocks: a child's blocks that are its parent's bytes, where
// it shares memory with it, are stored as Forked blocks and read back as
// the parent's, through two generations; a block the child changed, or
// memory it does not share, is its own.
func TestForkedBlocks(t *testing.T) {
	for _, bs := range []int{PageSize, 64 << 10} {
		dir := filepath.Join(t.TempDir(), "snap")
		parent := layoutRanges(7)
		child := cloneRanges(parent)
		dirty(child, 1, 4)
		grandchild := cloneRanges(child)
		dirty(grandchild, 6)
		// The child shares only the first half of its memory.
		half := parent[len(parent)/2].addr
		stats := writeTree(t, dir, []treeProc{
			{pid: 10, ranges: parent},
			{pid: 11, ppid: 10, ranges: child, shared: func(addr, n uint64) bool { return addr+n <= half }},
			{pid: 12, ppid: 11, ranges: grandchild, shared: everywhere},
		}, Options{BlockSize: bs, Mode: codec.Compress})
		if stats[10].Forked.Blocks != 0 || stats[11].Forked.Blocks == 0 || stats[12].Forked.Blocks == 0 {
			t.Fatalf("block size %d: forked blocks %d, %d, %d: want none in the root, some in each child", bs,
				stats[10].Forked.Blocks, stats[11].Forked.Blocks, stats[12].Forked.Blocks)
		}
		if stats[12].Forked.Blocks >= stats[12].Total.Blocks-stats[12].Zero.Blocks {
			t.Errorf("block size %d: every block of the grandchild forked, its changed one too", bs)
		}
		if stats[11].FileSize >= stats[10].FileSize || stats[12].FileSize >= stats[11].FileSize {
			t.Errorf("block size %d: pages files of %d, %d and %d bytes: the children's not smaller", bs, stats[10].FileSize, stats[11].FileSize, stats[12].FileSize)
		}
		checkReads(t, dir, 10, parent).Close()
		checkReads(t, dir, 11, child).Close()
		checkReads(t, dir, 12, grandchild).Close()
		s, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		if !s.Manifest.HasFeature(FeatureForked) {
			t.Errorf("manifest features %v: no %q", s.Manifest.Features, FeatureForked)
		}
		s.Close()
	}
}

// TestForkedRefused: a child whose state names a parent the snapshot
// does not hold cannot be read (nor its forked blocks guessed).
func TestForkedRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	parent := layoutRanges(3)
	writeTree(t, dir, []treeProc{
		{pid: 10, ranges: parent},
		{pid: 11, ppid: 10, ranges: cloneRanges(parent), shared: everywhere, statePPID: 99},
	}, Options{BlockSize: 64 << 10, Mode: codec.Compress})
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Once before its state is parsed, once after (the parent pid State
	// remembered).
	for _, parsed := range []bool{false, true} {
		if parsed {
			if _, err := s.State(11); err != nil {
				t.Fatal(err)
			}
		}
		if r, err := s.OpenPages(11, ReaderOptions{}); !errors.Is(err, ErrCorrupt) {
			if r != nil {
				r.Close()
			}
			t.Fatalf("pages of a child whose parent is not in the snapshot (state parsed first: %v): %v, want ErrCorrupt", parsed, err)
		}
	}
}

// TestForkedNotIncremental: an incremental snapshot takes unchanged blocks
// from its parent snapshot, never from the parent process.
func TestForkedNotIncremental(t *testing.T) {
	base := filepath.Join(t.TempDir(), "base")
	parent := layoutRanges(5)
	writeTree(t, base, []treeProc{{pid: 10, ranges: parent}, {pid: 11, ppid: 10, ranges: cloneRanges(parent)}}, Options{BlockSize: 64 << 10, Mode: codec.Compress})
	dir := filepath.Join(t.TempDir(), "incr")
	stats := writeTree(t, dir, []treeProc{
		{pid: 10, ranges: parent},
		{pid: 11, ppid: 10, ranges: cloneRanges(parent), shared: everywhere},
	}, Options{BlockSize: 64 << 10, Mode: codec.Compress, Parent: base})
	if stats[11].Forked.Blocks != 0 || stats[11].Parent.Blocks == 0 {
		t.Fatalf("incremental tree: %d forked and %d parent blocks in the child: want only parent ones", stats[11].Forked.Blocks, stats[11].Parent.Blocks)
	}
	checkReads(t, dir, 11, parent).Close()
}
