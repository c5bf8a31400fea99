package image

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image/seal"
)

// cloneRanges returns a deep copy of ranges.
func cloneRanges(ranges []memRange) []memRange {
	out := make([]memRange, len(ranges))
	for i, r := range ranges {
		out[i] = memRange{addr: r.addr, data: bytes.Clone(r.data), brk: r.brk}
	}
	return out
}

// dirty changes one byte of one page in each of the ranges listed (a
// non-zero byte, so that no block turns Zero).
func dirty(ranges []memRange, which ...int) {
	for _, i := range which {
		r := ranges[i%len(ranges)]
		off := len(r.data) / PageSize / 2 * PageSize
		r.data[off+123] ^= 0x5a
		if r.data[off+123] == 0 {
			r.data[off+123] = 1
		}
	}
}

// checkReads reads the whole memory of the snapshot at dir through
// every reader (cached, uncached, page-sized pieces, Verify) and compares
// it with ranges.
func checkReads(t *testing.T, dir string, pid int, ranges []memRange) *Reader {
	t.Helper()
	r := openReader(t, dir, pid, ReaderOptions{})
	lo, hi := ranges[0].addr-2*PageSize, ranges[len(ranges)-1].addr+uint64(len(ranges[len(ranges)-1].data))+PageSize
	want := expected(ranges, lo, hi)
	got := make([]byte, hi-lo)
	if _, err := r.ReadAt(got, int64(lo)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: cached read differs at %#x", dir, lo+uint64(firstDiff(got, want)))
	}
	clear(got)
	if _, err := r.Uncached().ReadAt(got, int64(lo)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: uncached read differs at %#x", dir, lo+uint64(firstDiff(got, want)))
	}
	// Single pages: a block read in part, by page checksums where a Raw
	// block has them (the parent's, for blocks the child takes from it).
	page := make([]byte, PageSize)
	for a := lo; a < hi; a += 5 * PageSize {
		if _, err := r.Uncached().ReadAt(page, int64(a)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(page, want[a-lo:a-lo+PageSize]) {
			t.Fatalf("%s: page at %#x differs", dir, a)
		}
	}
	if err := r.Verify(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	err := r.Stream(context.Background(), 0, maxAddr, true, func(c []Chunk) error {
		for _, x := range c {
			if !bytes.Equal(x.Data, want[x.Addr-lo:x.Addr-lo+uint64(len(x.Data))]) {
				t.Fatalf("%s: streamed block at %#x differs", dir, x.Addr)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func pagesSize(t *testing.T, dir string, pid int) int64 {
	t.Helper()
	fi, err := os.Stat(filepath.Join(dir, pagesName(pid)))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func TestParentChain(t *testing.T) {
	for _, bs := range []int{4 << 10, 64 << 10, 256 << 10} {
		for _, mode := range []codec.Mode{codec.Compress, codec.ShuffleLZ4} {
			t.Run(fmt.Sprintf("%s/%dK", mode, bs>>10), func(t *testing.T) {
				testParentChain(t, bs, mode)
			})
		}
	}
}

func testParentChain(t *testing.T, bs int, mode codec.Mode) {
	tmp := t.TempDir()
	base, child, grand := filepath.Join(tmp, "base"), filepath.Join(tmp, "child"), filepath.Join(tmp, "grand")
	r0 := layoutRanges(11)
	writeSnapshot(t, base, 7, r0, Options{BlockSize: bs, Mode: mode})

	// The child: a few pages changed, a range gone, one added at the end.
	r1 := cloneRanges(r0)
	dirty(r1, 0, 3, 7)
	r1 = append(r1[:4], r1[5:]...)
	extra := make([]byte, 9*PageSize)
	synth("random", extra, 99)
	last := r1[len(r1)-1]
	r1 = append(r1, memRange{addr: last.addr + uint64(len(last.data)) + 64*PageSize, data: extra})
	st := writeSnapshot(t, child, 7, r1, Options{Parent: base}) // BlockSize 0: the parent's
	if st.Parent.Blocks == 0 {
		t.Fatalf("child takes no block from its parent: %+v", st)
	}
	if got := pagesSize(t, child, 7); got >= pagesSize(t, base, 7)/2 {
		t.Errorf("child pages file %d bytes for 3 changed pages and one range added, parent's %d", got, pagesSize(t, base, 7))
	}
	s, err := Open(child)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Manifest.HasFeature(FeatureParent) || s.Manifest.Parent.Depth != 1 || s.Manifest.BlockSize != bs {
		t.Fatalf("child manifest: features %v, parent %+v, block size %d", s.Manifest.Features, s.Manifest.Parent, s.Manifest.BlockSize)
	}
	checkReads(t, child, 7, r1)

	// The grandchild: more changes, over the child.
	r2 := cloneRanges(r1)
	dirty(r2, 1, 4)
	st2 := writeSnapshot(t, grand, 7, r2, Options{Parent: child, Mode: codec.NoCompress})
	if st2.Parent.Blocks == 0 {
		t.Fatalf("grandchild takes no block from its parent: %+v", st2)
	}
	r := checkReads(t, grand, 7, r2)
	// Blocks the child took from the base are read from the base's file.
	var fromBase int
	for b := range r.Blocks() {
		if f, _ := r.Origin(b); strings.HasPrefix(f, base+string(filepath.Separator)) {
			fromBase++
		}
	}
	if fromBase == 0 {
		t.Error("no block of the grandchild is read from the base")
	}
	// Raw blocks of the base are read a page at a time, checked by the
	// base's page checksums (checkReads read single pages).
	var paged int
	for b := range r.Blocks() {
		if f, _ := r.Origin(b); f != r.Name() && r.PageChecked(b) {
			paged++
		}
	}
	if bs > PageSize && mode == codec.Compress && paged == 0 {
		t.Error("no block taken from a parent has page checksums")
	}
	gs, err := Open(grand)
	if err != nil {
		t.Fatal(err)
	}
	defer gs.Close()
	if gs.Manifest.Parent.Depth != 2 || gs.Parent() == nil || gs.Parent().Parent() == nil {
		t.Fatalf("grandchild chain: %+v", gs.Manifest.Parent)
	}
	// The parent is unchanged by its children.
	checkReads(t, base, 7, r0)
}

// TestParentComparesBytes: a block whose CRC32C equals the parent's but
// whose bytes differ is stored, not taken from the parent.
func TestParentComparesBytes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "base")
	data := make([]byte, 16*PageSize)
	synth("random", data, 3)
	writeSnapshot(t, dir, 7, []memRange{{addr: 0x400000, data: data}}, Options{BlockSize: 16 * PageSize})
	r := openReader(t, dir, 7, ReaderOptions{})
	b, _ := r.BlockAt(0x400000)
	m := &parentMatcher{r: r}
	same, err := m.inParent(data, b.CRC, &blockTag{addr: 0x400000})
	if err != nil || !same {
		t.Fatalf("same bytes: %v %v", same, err)
	}
	other := bytes.Clone(data)
	other[5000]++
	// The CRC handed in is the parent's: only the bytes can tell.
	if same, err := m.inParent(other, b.CRC, &blockTag{addr: 0x400000}); err != nil || same {
		t.Fatalf("different bytes, equal crc: in parent %v (%v)", same, err)
	}
	if same, _ := m.inParent(other, codec.Checksum(other), &blockTag{addr: 0x400000}); same {
		t.Fatal("different crc: in parent")
	}
	if same, _ := m.inParent(data[:8*PageSize], codec.Checksum(data[:8*PageSize]), &blockTag{addr: 0x400000}); same {
		t.Fatal("a shorter block: in parent")
	}
}

func TestParentRefused(t *testing.T) {
	tmp := t.TempDir()
	ranges := layoutRanges(5)
	base, other, child := filepath.Join(tmp, "base"), filepath.Join(tmp, "other"), filepath.Join(tmp, "child")
	writeSnapshot(t, base, 7, ranges, Options{BlockSize: 64 << 10})
	writeSnapshot(t, other, 7, ranges, Options{BlockSize: 64 << 10})
	r1 := cloneRanges(ranges)
	dirty(r1, 2, 6)
	writeSnapshot(t, child, 7, r1, Options{Parent: base})

	t.Run("missing", func(t *testing.T) {
		moved := base + ".moved"
		mustDo(t, os.Rename(base, moved))
		defer os.Rename(moved, base)
		_, err := Open(child)
		if !errors.Is(err, ErrParentMissing) || !errors.Is(err, ErrIncomplete) || !strings.Contains(err.Error(), base) {
			t.Fatalf("Open with the parent gone: %v", err)
		}
	})
	t.Run("replaced", func(t *testing.T) {
		mustDo(t, os.Rename(base, base+".old"), os.Rename(other, base))
		defer func() { mustDo(t, os.Rename(base, other), os.Rename(base+".old", base)) }()
		_, err := Open(child)
		if !errors.Is(err, ErrParentChanged) || errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), filepath.Join(base, ManifestName)) {
			t.Fatalf("Open with another snapshot as the parent: %v", err)
		}
	})
	t.Run("manifest edited", func(t *testing.T) {
		p := filepath.Join(base, ManifestName)
		orig, err := os.ReadFile(p)
		mustDo(t, err)
		defer os.WriteFile(p, orig, 0o600)
		var m map[string]any
		mustDo(t, json.Unmarshal(orig, &m))
		m["tool"] = "edited"
		b, _ := json.Marshal(m)
		mustDo(t, os.WriteFile(p, b, 0o600))
		if _, err := Open(child); !errors.Is(err, ErrParentChanged) {
			t.Fatalf("Open with the parent's manifest edited: %v", err)
		}
	})
	t.Run("block edited", func(t *testing.T) {
		// A block the child takes from the parent, changed in the
		// parent's pages file: the read fails naming the parent's file.
		r := openReader(t, child, 7, ReaderOptions{})
		var pb Block
		for b := range r.Blocks() {
			if f, _ := r.Origin(b); strings.HasPrefix(f, base) && b.Kind != codec.Zero {
				pb = b
				break
			}
		}
		if pb.Len == 0 {
			t.Fatal("no block from the parent")
		}
		file, index := r.Origin(pb)
		pr := openReader(t, base, 7, ReaderOptions{})
		orig, _ := pr.BlockAt(pb.Addr)
		if orig.Index != index {
			t.Fatalf("origin block %d, the parent's block there is %d", index, orig.Index)
		}
		f, err := os.OpenFile(file, os.O_RDWR, 0)
		mustDo(t, err)
		var one [1]byte
		f.ReadAt(one[:], int64(orig.Off))
		one[0] ^= 0xff
		f.WriteAt(one[:], int64(orig.Off))
		defer func() { one[0] ^= 0xff; f.WriteAt(one[:], int64(orig.Off)); f.Close() }()
		r2 := openReader(t, child, 7, ReaderOptions{})
		_, err = r2.Uncached().ReadAt(make([]byte, pb.Len), int64(pb.Addr))
		var be *BlockError
		if !errors.As(err, &be) || be.File != file || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("read of an edited parent block: %v", err)
		}
	})
	t.Run("old reader", func(t *testing.T) {
		delete(knownFeatures, FeatureParent)
		defer func() { knownFeatures[FeatureParent] = true }()
		if _, err := Open(child); !errors.Is(err, ErrVersion) {
			t.Fatalf("a build without feature %q opened the child: %v", FeatureParent, err)
		}
	})
	t.Run("sealed or signed child", func(t *testing.T) {
		key, _ := signingKey(t)
		priv, err := seal.ParseSigner(key)
		mustDo(t, err)
		_, err = Create(filepath.Join(tmp, "signed"), Options{Parent: base, Sign: priv})
		if !errors.Is(err, ErrUnsupported) {
			t.Fatalf("signed child: %v", err)
		}
	})
	t.Run("sealed parent", func(t *testing.T) {
		dir, _, _ := sealed(t, 64<<10)
		_, err := Create(filepath.Join(tmp, "of-sealed"), Options{Parent: dir})
		if !errors.Is(err, ErrUnsupported) {
			t.Fatalf("child of a sealed parent: %v", err)
		}
	})
	t.Run("block size", func(t *testing.T) {
		_, err := Create(filepath.Join(tmp, "bs"), Options{Parent: base, BlockSize: 4096})
		if !errors.Is(err, ErrUnsupported) {
			t.Fatalf("child of another block size: %v", err)
		}
	})
	t.Run("missing at dump", func(t *testing.T) {
		_, err := Create(filepath.Join(tmp, "nope-child"), Options{Parent: filepath.Join(tmp, "nope")})
		if !errors.Is(err, ErrParentMissing) {
			t.Fatalf("dump against a missing parent: %v", err)
		}
		if _, serr := os.Stat(filepath.Join(tmp, "nope-child")); serr == nil {
			t.Error("a refused dump created its directory")
		}
	})
}

// TestParentSigned: a signed snapshot cannot be a parent (it opens only
// with its signer's key, which a child in clear does not carry).
func TestParentSigned(t *testing.T) {
	key, _ := signingKey(t)
	priv, err := seal.ParseSigner(key)
	mustDo(t, err)
	tmp := t.TempDir()
	writeSnapshot(t, filepath.Join(tmp, "base"), 7, layoutRanges(4), Options{BlockSize: 64 << 10, Sign: priv})
	if _, err := Create(filepath.Join(tmp, "child"), Options{Parent: filepath.Join(tmp, "base")}); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("child of a signed parent: %v", err)
	}
}

// TestParentRelativePath: a parent given relative is recorded relative to
// the child, so that the two move together.
func TestParentRelativePath(t *testing.T) {
	tmp := t.TempDir()
	t.Chdir(tmp)
	mustDo(t, os.MkdirAll("a/snaps", 0o700))
	ranges := layoutRanges(3)
	writeSnapshot(t, "a/snaps/base", 7, ranges, Options{})
	writeSnapshot(t, "a/snaps/inc/1", 7, ranges, Options{Parent: "a/snaps/base"})
	s, err := Open("a/snaps/inc/1")
	mustDo(t, err)
	if s.Manifest.Parent.Path != "../../base" {
		t.Errorf("parent recorded as %q, want ../../base", s.Manifest.Parent.Path)
	}
	s.Close()
	mustDo(t, os.Rename("a", "b"))
	checkReads(t, filepath.Join(tmp, "b/snaps/inc/1"), 7, ranges)
}

// TestParentDepth: a chain is bounded.
func TestParentDepth(t *testing.T) {
	tmp := t.TempDir()
	data := make([]byte, 4*PageSize)
	synth("random", data, 1)
	ranges := []memRange{{addr: 0x10000, data: data}}
	prev := filepath.Join(tmp, "0")
	writeSnapshot(t, prev, 7, ranges, Options{})
	for i := 1; i <= MaxChainDepth; i++ {
		dir := filepath.Join(tmp, string(rune('a'+i)))
		writeSnapshot(t, dir, 7, ranges, Options{Parent: prev})
		prev = dir
	}
	checkReads(t, prev, 7, ranges)
	if _, err := Create(filepath.Join(tmp, "deep"), Options{Parent: prev}); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("a chain past %d: %v", MaxChainDepth, err)
	}
}

// TestParentOtherProcess: a process the parent does not hold is stored
// whole.
func TestParentOtherProcess(t *testing.T) {
	tmp := t.TempDir()
	ranges := layoutRanges(9)
	writeSnapshot(t, filepath.Join(tmp, "base"), 7, ranges, Options{})
	st := writeSnapshot(t, filepath.Join(tmp, "child"), 8, ranges, Options{Parent: filepath.Join(tmp, "base")})
	if st.Parent.Blocks != 0 {
		t.Fatalf("pid 8 took %d blocks from pid 7", st.Parent.Blocks)
	}
	checkReads(t, filepath.Join(tmp, "child"), 8, ranges)
}

// TestParentRefWellFormed: the manifest's parent entry and the feature
// go together.
func TestParentRefWellFormed(t *testing.T) {
	good := &ParentRef{Path: "../base", Manifest: strings.Repeat("ab", 32), Depth: 1}
	for _, tc := range []struct {
		ref      *ParentRef
		features []string
		ok       bool
	}{
		{nil, nil, true},
		{good, []string{FeatureParent}, true},
		{good, nil, false},
		{nil, []string{FeatureParent}, false},
		{&ParentRef{Path: "", Manifest: good.Manifest, Depth: 1}, []string{FeatureParent}, false},
		{&ParentRef{Path: "x", Manifest: "abc", Depth: 1}, []string{FeatureParent}, false},
		{&ParentRef{Path: "x", Manifest: good.Manifest, Depth: 0}, []string{FeatureParent}, false},
		{&ParentRef{Path: "x", Manifest: good.Manifest, Depth: MaxChainDepth + 1}, []string{FeatureParent}, false},
	} {
		err := checkParentRef(&Manifest{Parent: tc.ref, Features: tc.features})
		if (err == nil) != tc.ok {
			t.Errorf("%+v %v: %v", tc.ref, tc.features, err)
		}
	}
}
