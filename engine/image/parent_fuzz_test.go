package image

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/engine/codec"
)

// FuzzParentManifest: a manifest's parent entry is accepted only whole
// (feature, path, digest, bounded depth); never a panic.
func FuzzParentManifest(f *testing.F) {
	m := Manifest{Format: manifestFormat, Version: 1, PageSize: 4096, BlockSize: 262144, Features: []string{FeatureParent},
		Parent:    &ParentRef{Path: "../base", Manifest: strings.Repeat("0f", 32), Depth: 1},
		Processes: []ProcessEntry{{PID: 1, State: "process-1.json", Index: "pagemap-1.img", Pages: "pages-1.img"}},
		Files:     map[string]FileSum{"process-1.json": {Size: 1, CRC32C: "0"}, "pagemap-1.img": {Size: 64, CRC32C: "0"}, "pages-1.img": {Size: 0, CRC32C: "0"}}}
	b, _ := json.Marshal(m)
	f.Add(b)
	f.Add(bytes.Replace(b, []byte(`"depth":1`), []byte(`"depth":17`), 1))
	f.Add(bytes.Replace(b, []byte(`"path":"../base"`), []byte(`"path":"s3://b/p"`), 1))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseManifest(b)
		if err != nil || m.Parent == nil {
			return
		}
		p := m.Parent
		if !m.HasFeature(FeatureParent) || p.Path == "" || p.Depth < 1 || p.Depth > MaxChainDepth || len(p.Manifest) != 64 {
			t.Fatalf("accepted parent %+v with features %v", p, m.Features)
		}
		if loc, err := parentLocation("/snap/child", p); err == nil && loc == "" {
			t.Fatal("empty parent location")
		}
		parentLocation("s3://bucket/child", p)
	})
}

// FuzzParentIndex: a child's index, whatever its bytes, either resolves
// against its parent into blocks that lie inside the chain's pages files
// and match the parent's, or fails with an error; never a panic.
func FuzzParentIndex(f *testing.F) {
	dir := filepath.Join(f.TempDir(), "base")
	data := make([]byte, 24*PageSize)
	synth("random", data[:8*PageSize], 1)
	synth("records", data[8*PageSize:], 2)
	writeSnapshot(f, dir, 7, []memRange{{addr: 0x10000, data: data}}, Options{BlockSize: 4 * PageSize})
	s, err := Open(dir)
	if err != nil {
		f.Fatal(err)
	}
	pr, err := s.OpenPages(7, ReaderOptions{})
	if err != nil {
		f.Fatal(err)
	}
	// Seed: the parent's own index with every other block a Parent one.
	ix := *pr.lay.ix
	ix.Blocks = append([]BlockRecord(nil), ix.Blocks...)
	ix.PagesSize = 0
	for i := range ix.Blocks {
		if i%2 == 0 {
			ix.Blocks[i] = BlockRecord{Kind: codec.Parent, CRC: ix.Blocks[i].CRC}
		} else {
			ix.Blocks[i].Kind, ix.Blocks[i].StoredLen = codec.Zero, 0
		}
	}
	seed, _ := ix.MarshalBinary()
	f.Add(seed)
	f.Add(seedIndex())
	virtual := alignUp(0, rawAlign) + pr.lay.ix.PagesSize
	f.Fuzz(func(t *testing.T, b []byte) {
		ix, err := UnmarshalIndex(b, -1)
		if err != nil || ix.PagesSize != 0 {
			return // a child with pages of its own needs its file
		}
		r, err := newReader("child", nopFile{}, ix, ReaderOptions{})
		if err != nil {
			return
		}
		if err := r.attachParent(pr, codec.Parent); err != nil {
			return
		}
		for blk := range r.Blocks() {
			if blk.Off+uint64(blk.StoredLen) > virtual {
				t.Fatalf("block %d past the chain's pages", blk.Index)
			}
			if pb, ok := pr.BlockAt(blk.Addr); blk.Kind != codec.Zero && (!ok || pb.CRC != blk.CRC || pb.Len != blk.Len) {
				t.Fatalf("block %d resolved to %+v, the parent's is %+v", blk.Index, blk, pb)
			}
		}
	})
}

type nopFile struct{}

func (nopFile) ReadAt(p []byte, off int64) (int, error) { return 0, nil }
func (nopFile) Close() error                            { return nil }
