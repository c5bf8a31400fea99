package image

import (
	"fmt"

	"github.com/lazyfs/lazyfs/engine/codec"
)

// Copy-on-write memory of a tree (feature "forked").
//
// A child of a process tree still shares, copy-on-write since fork, much
// of its private memory with its parent: a pre-fork server's workers
// share the weights or data the parent loaded. The dump knows those pages
// (the same page frames at the same addresses, image.VMA.Inherited), and
// stores a block of the child wholly in them as a Forked block: no bytes,
// the CRC32C of its bytes, which are the parent's block at the same
// address and of the same length (the parent is dumped first). A reader
// resolves them when it opens the child's pages, from the parent's pages
// (the parent's own Forked blocks resolved in turn), as it resolves an
// incremental snapshot's Parent blocks: the payloads of the child are its
// own pages file followed by its parent's. A snapshot is either
// incremental or holds Forked blocks, not both, and is neither sealed nor
// signed: such dumps store every child's pages whole.

// FeatureForked is the format feature of snapshots with Forked blocks.
const FeatureForked = "forked"

func init() { knownFeatures[FeatureForked] = true }

// maxForkDepth bounds the chain of parents a child's Forked blocks are
// resolved through (a damaged state could make a cycle).
const maxForkDepth = 64

// forkedFrom is what a child of the tree being dumped takes from its
// parent: the parent's pid, and which blocks of the child it still
// shares with it (within: address and length).
type forkedFrom struct {
	ppid   int
	within func(addr, n uint64) bool
}

// Forked says that pid, a child of ppid in the tree being dumped, still
// shares with it the pages within reports: the blocks of pid wholly in
// them whose bytes are those of ppid's block at the same address are
// stored as Forked blocks. Call it before Pages(pid), after ppid's pages
// are written. It does nothing for a snapshot that is incremental,
// sealed or signed.
func (w *Writer) Forked(pid, ppid int, within func(addr, n uint64) bool) {
	if w.parent != nil || w.keys != nil || w.signer != nil {
		return
	}
	if w.forked == nil {
		w.forked = map[int]forkedFrom{}
	}
	w.forked[pid] = forkedFrom{ppid: ppid, within: within}
}

// forkedMatcher returns the matcher of pid's Forked blocks, or nil.
func (w *Writer) forkedMatcher(pid int) *forkedMatcher {
	f, ok := w.forked[pid]
	if !ok || w.indexes[f.ppid] == nil {
		return nil
	}
	return &forkedMatcher{lay: w.indexes[f.ppid], within: f.within}
}

// forkedMatcher tells the pipeline which blocks are the parent's.
type forkedMatcher struct {
	lay    *layout
	within func(addr, n uint64) bool
}

// inParent reports whether the block tagged tag, of bytes src whose
// CRC32C is crc, is the parent's block at its address: wholly in the
// pages the child shares with the parent, and the parent's block there of
// the same length and checksum (the same page frames were the same bytes;
// the checksum is a check of that).
func (m *forkedMatcher) inParent(src []byte, crc uint32, tag any) (bool, error) {
	addr := tag.(*blockTag).addr
	if !m.within(addr, uint64(len(src))) {
		return false, nil
	}
	pb, ok := m.lay.blockAt(addr)
	return ok && pb.Addr == addr && pb.Len == uint32(len(src)) && pb.CRC == crc && pb.Kind != codec.Zero, nil
}

// forkedParent resolves the Forked blocks of r, the pages of pid: from the
// pages of its parent in the tree.
func (s *Snapshot) forkedParent(r *Reader, pid int, opts ReaderOptions, depth int) error {
	n := 0
	for _, rec := range r.lay.ix.Blocks {
		if rec.Kind == codec.Forked {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if r.parent != nil {
		return fmt.Errorf("%s: %w: blocks both in a parent snapshot and in the parent process", r.name, ErrCorrupt)
	}
	if depth >= maxForkDepth {
		return fmt.Errorf("%s: %w: forked blocks through more than %d parents", r.name, ErrCorrupt, maxForkDepth)
	}
	ppid, err := s.ppid(pid)
	if err != nil {
		return err
	}
	if _, ok := s.Manifest.Process(ppid); !ok || ppid == pid {
		return fmt.Errorf("%s: %w: %d blocks are in the parent process %d, which the snapshot does not hold", r.name, ErrCorrupt, n, ppid)
	}
	pr, err := s.openPages(ppid, opts, depth+1)
	if err != nil {
		return err
	}
	if err := r.attachParent(pr, codec.Forked); err != nil {
		pr.Close()
		return err
	}
	return nil
}
