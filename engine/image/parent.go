package image

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

// Incremental snapshots (feature "parent").
//
// A snapshot dumped with a parent (snapctl dump --parent DIR) stores only
// the blocks whose bytes differ from the parent's block at the same
// address; every other block's record has kind codec.Parent, no stored
// bytes, and the CRC32C of its bytes. The manifest's "parent" entry says
// where the parent is and which one it must be:
//
//	"parent": {"path": "../base", "manifest_sha256": "…", "depth": 1}
//
// path is the parent's directory, relative to the child's when it was given
// relative (the pair moves together, as CRIU's parent link does), absolute
// or an s3:// address otherwise. manifest_sha256 is the SHA-256 of the
// parent's snapshot.json, which holds the size and CRC32C of each of its
// files: a parent replaced by another snapshot, or whose manifest was
// edited, is refused (ErrParentChanged) before anything of it is used;
// its index files are then checked against that manifest as any
// snapshot's, and each block a child takes from it against the CRC32C the
// child recorded for it. depth is the length of the chain below the child
// (1: the parent is a full snapshot), at most MaxChainDepth.
//
// A reader resolves the chain when it opens a process's pages: each Parent
// block is replaced by the block that holds its bytes (the parent's, or
// its parent's, ...), whose payload sits at an offset of a virtual pages
// file made of the child's own file, then (from the next 4 KiB boundary)
// the parent's virtual pages file. Everything that reads payloads by
// offset (the cached and uncached readers, the restore's fill, the
// decoders) then reads a chain as it reads one snapshot.

// FeatureParent is the format feature of incremental snapshots.
const FeatureParent = "parent"

func init() { knownFeatures[FeatureParent] = true }

// MaxChainDepth bounds the snapshots below an incremental one: a dump
// with a parent at that depth is refused (take a full dump), and so is a
// snapshot that claims more.
const MaxChainDepth = 16

// ParentRef is the manifest's "parent" entry.
type ParentRef struct {
	// Path is where the parent is: relative to the child's directory, or
	// absolute, or an address.
	Path string `json:"path"`
	// Manifest is the SHA-256 of the parent's snapshot.json, in hex.
	Manifest string `json:"manifest_sha256"`
	// Depth is how many snapshots the chain holds below this one.
	Depth int `json:"depth"`
}

var (
	// ErrParentMissing: the parent of an incremental snapshot is not
	// where its manifest says, or is incomplete. It matches ErrIncomplete:
	// the snapshot cannot be read whole.
	ErrParentMissing error = &parentMissing{}
	// ErrParentChanged: the parent of an incremental snapshot is not the
	// snapshot it was dumped against (replaced, or its manifest edited).
	ErrParentChanged = errors.New("the parent snapshot is not the one the incremental snapshot was dumped against")
)

type parentMissing struct{}

func (*parentMissing) Error() string        { return "parent snapshot missing" }
func (*parentMissing) Is(target error) bool { return target == ErrIncomplete }

// checkParentRef validates the "parent" entry of a manifest.
func checkParentRef(m *Manifest) error {
	has := m.HasFeature(FeatureParent)
	p := m.Parent
	switch {
	case p == nil && !has:
		return nil
	case p == nil:
		return fmt.Errorf("%w: manifest needs feature %q but names no parent", ErrCorrupt, FeatureParent)
	case !has:
		return fmt.Errorf("%w: manifest names a parent without feature %q", ErrCorrupt, FeatureParent)
	case p.Path == "" || strings.ContainsRune(p.Path, 0):
		return fmt.Errorf("%w: parent path %q", ErrCorrupt, p.Path)
	case m.Seal != nil || m.Signature != nil:
		return fmt.Errorf("%w: a sealed or signed snapshot names a parent", ErrCorrupt)
	case p.Depth < 1 || p.Depth > MaxChainDepth:
		return fmt.Errorf("%w: parent chain depth %d (at most %d)", ErrCorrupt, p.Depth, MaxChainDepth)
	}
	if b, err := hex.DecodeString(p.Manifest); err != nil || len(b) != sha256.Size {
		return fmt.Errorf("%w: parent manifest digest %q", ErrCorrupt, p.Manifest)
	}
	return nil
}

// parentLocation returns where the parent that ref names is, for a child
// at dir.
func parentLocation(dir string, ref *ParentRef) (string, error) {
	if store.IsRemote(ref.Path) || filepath.IsAbs(ref.Path) {
		return ref.Path, nil
	}
	if store.IsRemote(dir) {
		return "", fmt.Errorf("%s: %w: parent path %q is relative, the snapshot is at an address", joinName(dir, ManifestName), ErrCorrupt, ref.Path)
	}
	return filepath.Join(dir, ref.Path), nil
}

// ParentPath returns the path or address to record in a child's manifest
// for the parent at parent (as the user gave it), the child being at
// child: relative to the child when parent is a relative path, as given
// otherwise.
func ParentPath(child, parent string) (string, error) {
	if store.IsRemote(parent) || filepath.IsAbs(parent) {
		return parent, nil
	}
	if store.IsRemote(child) {
		return "", fmt.Errorf("parent %s: a snapshot at an address needs its parent's absolute path or address", parent)
	}
	ac, err := filepath.Abs(child)
	if err != nil {
		return "", err
	}
	ap, err := filepath.Abs(parent)
	if err != nil {
		return "", err
	}
	return filepath.Rel(ac, ap)
}

// openParent opens the parent of s, checks it is the one s was dumped
// against, and keeps it open with s (its own parent too, recursively).
func (s *Snapshot) openParent(o OpenOptions) error {
	ref := s.Manifest.Parent
	loc, err := parentLocation(s.Dir, ref)
	if err != nil {
		return err
	}
	o.asParent = &parentCheck{child: s.Dir, ref: ref}
	p, err := OpenWith(loc, o)
	if err != nil {
		switch {
		case errors.Is(err, ErrParentMissing) || errors.Is(err, ErrParentChanged):
			return fmt.Errorf("%s: parent %s: %w", s.Dir, loc, err)
		case errors.Is(err, ErrIncomplete) || errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("%s: %w: %s (the manifest's parent %q) cannot be opened: %v", s.Dir, ErrParentMissing, loc, ref.Path, err)
		}
		return fmt.Errorf("%s: parent %s: %w", s.Dir, loc, err)
	}
	if p.Manifest.BlockSize != s.Manifest.BlockSize {
		p.Close()
		return fmt.Errorf("%s: %w: block size %d, its parent %s has %d", joinName(s.Dir, ManifestName), ErrCorrupt, s.Manifest.BlockSize, loc, p.Manifest.BlockSize)
	}
	s.parent = p
	return nil
}

// parentCheck is what a child recorded of its parent.
type parentCheck struct {
	child string
	ref   *ParentRef
}

// checkAsParent checks s, opened as a parent, against what its child
// recorded: the SHA-256 of its manifest, then the depth of the chain
// below it, one less than the child's (so that depths fall by one at each
// step, and a chain that loops ends in an error).
func (s *Snapshot) checkAsParent(c *parentCheck) error {
	if c == nil {
		return nil
	}
	sum := sha256.Sum256(s.manifest)
	if got := hex.EncodeToString(sum[:]); got != c.ref.Manifest {
		return fmt.Errorf("%s: %w: its SHA-256 is %.16s…, %s was dumped against %.16s… (the parent was replaced or edited)",
			joinName(s.Dir, ManifestName), ErrParentChanged, got, c.child, c.ref.Manifest)
	}
	if s.Manifest.HasFeature(FeatureSealed) || s.Manifest.HasFeature(FeatureSigned) {
		// Dumps refuse such parents; a child that names one anyway was
		// not made by us.
		return fmt.Errorf("%s: %w: the parent of %s is sealed or signed; an incremental snapshot takes blocks from a snapshot in clear only",
			joinName(s.Dir, ManifestName), ErrCorrupt, c.child)
	}
	depth := 0
	if s.Manifest.Parent != nil {
		depth = s.Manifest.Parent.Depth
	}
	if depth+1 != c.ref.Depth {
		return fmt.Errorf("%s: %w: a parent whose chain is %d deep, below %s which says %d", joinName(s.Dir, ManifestName), ErrCorrupt, depth, c.child, c.ref.Depth-1)
	}
	return nil
}

// Parent returns the parent of an incremental snapshot, open, or nil.
func (s *Snapshot) Parent() *Snapshot { return s.parent }

// chain resolves the Parent blocks of r, the pages of pid, against the
// parent snapshot.
func (s *Snapshot) chain(r *Reader, pid int, opts ReaderOptions) error {
	n := 0
	for _, rec := range r.lay.ix.Blocks {
		if rec.Kind == codec.Parent {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if s.parent == nil {
		return fmt.Errorf("%s: %w: %d blocks are in a parent, the manifest names none", r.name, ErrCorrupt, n)
	}
	if _, ok := s.parent.Manifest.Process(pid); !ok {
		return fmt.Errorf("%s: %w: %d blocks are in the parent %s, which holds no process %d", r.name, ErrCorrupt, n, s.parent.Dir, pid)
	}
	pr, err := s.parent.OpenPages(pid, opts)
	if err != nil {
		return err
	}
	pr.name = joinName(s.parent.Dir, pr.name)
	if err := r.attachParent(pr, codec.Parent); err != nil {
		pr.Close()
		return err
	}
	return nil
}

// attachParent replaces every block of r of kind (Parent, or Forked) by
// the block of pr (the parent snapshot's pages of the same process, or
// the pages of its parent process) that holds its bytes, and makes r's
// payloads the chain's.
func (r *Reader) attachParent(pr *Reader, kind codec.Kind) error {
	lay := r.lay
	if pr.lay.ix.BlockSize != lay.ix.BlockSize {
		return fmt.Errorf("%s: %w: block size %d, the parent's %d", r.name, ErrCorrupt, lay.ix.BlockSize, pr.lay.ix.BlockSize)
	}
	base := alignUp(lay.ix.PagesSize, rawAlign)
	for ri, run := range lay.ix.Runs {
		for i := run.FirstBlock; i < run.FirstBlock+blocksInRange(run.Addr, run.End(), lay.ix.BlockSize); i++ {
			if lay.ix.Blocks[i].Kind != kind {
				continue
			}
			b := lay.block(ri, i)
			pb, ok := pr.lay.blockAt(b.Addr)
			if !ok || pb.Addr != b.Addr || pb.Len != b.Len || pb.CRC != b.CRC || pb.Kind == codec.Zero {
				return fmt.Errorf("%s: block %d at %#x: %w: it is in the parent, whose %s holds no block of %d bytes with crc32c %08x there",
					r.name, i, b.Addr, ErrCorrupt, pr.name, b.Len, b.CRC)
			}
			lay.ix.Blocks[i] = BlockRecord{Kind: pb.Kind, StoredLen: pb.StoredLen, CRC: pb.CRC}
			lay.off[i] = base + pb.Off
			if pr.pageCRCs(pb) {
				if r.pcrc == nil {
					r.pcrc = &pageCRCs{first: map[uint64]uint32{}}
				}
				first := pr.pcrc.first[pb.Index]
				r.pcrc.first[i] = uint32(len(r.pcrc.crcs))
				r.pcrc.crcs = append(r.pcrc.crcs, pr.pcrc.crcs[first:first+pb.Len/PageSize]...)
			}
		}
	}
	r.src = &chainPayloads{own: r.src, ownSize: lay.ix.PagesSize, base: base, parent: pr.src}
	r.parent, r.base = pr, base
	return nil
}

// origin returns the pages file that holds block b's payload and the
// block's index there.
func (r *Reader) origin(b Block) (string, uint64) {
	if r.parent != nil && b.Kind != codec.Zero && b.Off >= r.base {
		if pb, ok := r.parent.lay.blockAt(b.Addr); ok {
			return r.parent.origin(pb)
		}
	}
	return r.name, b.Index
}

// Origin returns the pages file that holds block b (r's own, or a
// parent's in an incremental snapshot) and the block's index in it, for
// errors.
func (r *Reader) Origin(b Block) (file string, index uint64) { return r.origin(b) }

// ParentStats returns, for an incremental snapshot, the figures of the
// blocks taken from each snapshot below it, parent first.
func (r *Reader) ParentStats() []Stats {
	var out []Stats
	for p := r.parent; p != nil; p = p.parent {
		out = append(out, p.stats)
	}
	return out
}

// chainPayloads is the virtual pages file of an incremental snapshot:
// its own file at [0, ownSize), zeros up to base, then the parent's
// (virtual) pages file.
type chainPayloads struct {
	own           io.ReaderAt
	ownSize, base uint64
	parent        io.ReaderAt
}

// Forget passes on to the files of the chain that hold [off, off+n)
// (Forgetter).
func (c *chainPayloads) Forget(off, n int64) bool {
	lo, hi := uint64(max(off, 0)), uint64(max(off+n, 0))
	held := false
	if lo < c.ownSize {
		if fg, ok := c.own.(Forgetter); ok {
			held = fg.Forget(int64(lo), int64(min(hi, c.ownSize)-lo)) || held
		}
	}
	if hi > c.base {
		if fg, ok := c.parent.(Forgetter); ok {
			from := max(lo, c.base)
			held = fg.Forget(int64(from-c.base), int64(hi-from)) || held
		}
	}
	return held
}

func (c *chainPayloads) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read pages at %d: negative offset", off)
	}
	n := 0
	for n < len(p) {
		o := uint64(off) + uint64(n)
		var k int
		var err error
		switch {
		case o < c.ownSize:
			m := int(min(uint64(len(p)-n), c.ownSize-o))
			k, err = c.own.ReadAt(p[n:n+m], int64(o))
			if k == m && errors.Is(err, io.EOF) {
				err = nil
			}
		case o < c.base:
			k = int(min(uint64(len(p)-n), c.base-o))
			clear(p[n : n+k])
		default:
			k, err = c.parent.ReadAt(p[n:], int64(o-c.base))
		}
		n += k
		if err != nil {
			return n, err
		}
		if k == 0 {
			return n, io.ErrUnexpectedEOF
		}
	}
	return n, nil
}

// parentMatcher answers, for the blocks a PagesWriter encodes, whether
// the parent holds the same bytes at the same address: a different CRC32C
// says no at once; an equal one is confirmed by comparing the bytes with
// the parent's block, decoded and checked.
type parentMatcher struct {
	r *Reader
}

func (m *parentMatcher) inParent(src []byte, crc uint32, tag any) (bool, error) {
	addr := tag.(*blockTag).addr
	pb, ok := m.r.lay.blockAt(addr)
	if !ok || pb.Addr != addr || pb.Len != uint32(len(src)) || pb.CRC != crc || pb.Kind == codec.Zero {
		return false, nil
	}
	buf := scratch(len(src))
	defer scratchPool.Put(buf)
	if err := m.r.load(pb, *buf); err != nil {
		return false, fmt.Errorf("read the parent: %w", err)
	}
	return bytes.Equal(*buf, src), nil
}

// openParentForDump opens the parent of a dump into dir (o.Parent),
// refuses what an incremental dump does not support, sets o.BlockSize to
// the parent's if it is zero, and returns the manifest entry naming it.
func openParentForDump(dir string, o *Options) (*Snapshot, *ParentRef, error) {
	if o.Seal != nil || o.Sign != nil {
		return nil, nil, fmt.Errorf("%w: an incremental snapshot (--parent) cannot be sealed or signed", ErrUnsupported)
	}
	path, err := ParentPath(dir, o.Parent)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	if m, err := readManifest(o.Parent); err == nil && (m.HasFeature(FeatureSealed) || m.HasFeature(FeatureSigned)) {
		return nil, nil, fmt.Errorf("%w: parent %s is sealed or signed: an incremental snapshot takes blocks from a snapshot in clear only", ErrUnsupported, o.Parent)
	}
	p, err := OpenWith(o.Parent, OpenOptions{Remote: o.Remote})
	if err == nil && (p.Manifest.HasFeature(FeatureSealed) || p.Manifest.HasFeature(FeatureSigned)) {
		// The look before it could not read a remote parent's manifest.
		p.Close()
		return nil, nil, fmt.Errorf("%w: parent %s is sealed or signed: an incremental snapshot takes blocks from a snapshot in clear only", ErrUnsupported, o.Parent)
	}
	if err != nil && errors.Is(err, ErrNoIdentity) {
		return nil, nil, fmt.Errorf("%w: parent %s is sealed: an incremental snapshot takes blocks from a snapshot in clear only", ErrUnsupported, o.Parent)
	}
	if err != nil {
		if errors.Is(err, ErrIncomplete) || errors.Is(err, os.ErrNotExist) {
			if !errors.Is(err, ErrParentMissing) {
				err = fmt.Errorf("%w: %v", ErrParentMissing, err)
			}
		}
		return nil, nil, fmt.Errorf("parent %s: %w", o.Parent, err)
	}
	depth := 1
	if p.Manifest.Parent != nil {
		depth += p.Manifest.Parent.Depth
	}
	switch {
	case depth > MaxChainDepth:
		p.Close()
		return nil, nil, fmt.Errorf("%w: parent %s is already %d snapshots deep (at most %d): take a full dump", ErrUnsupported, o.Parent, depth-1, MaxChainDepth)
	case o.BlockSize == 0:
		o.BlockSize = p.Manifest.BlockSize
	case o.BlockSize != p.Manifest.BlockSize:
		p.Close()
		return nil, nil, fmt.Errorf("%w: block size %d, parent %s has blocks of %d: an incremental dump keeps its parent's", ErrUnsupported, o.BlockSize, o.Parent, p.Manifest.BlockSize)
	}
	sum := sha256.Sum256(p.manifest)
	return p, &ParentRef{Path: path, Manifest: hex.EncodeToString(sum[:]), Depth: depth}, nil
}

// closeParent closes the parent of an incremental dump.
func (w *Writer) closeParent() {
	if w.parent != nil {
		w.parent.Close()
		w.parent = nil
	}
}

// parentPages opens the parent's pages of pid for an incremental dump, or
// returns nil (no parent, or a parent without that process).
func (w *Writer) parentPages(pid int) (*Reader, error) {
	if w.parent == nil {
		return nil, nil
	}
	if _, ok := w.parent.Manifest.Process(pid); !ok {
		return nil, nil
	}
	r, err := w.parent.OpenPages(pid, ReaderOptions{Threads: 1})
	if err != nil {
		return nil, fmt.Errorf("parent %s: %w", w.parent.Dir, err)
	}
	r.name = joinName(w.parent.Dir, r.name)
	return r, nil
}
