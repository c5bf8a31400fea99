package image

import (
	"encoding/json"
	"testing"
)

// seedIndex returns a small valid index.
func seedIndex() []byte {
	ix := &Index{BlockSize: 8192, PagesSize: 4096 + 100, Runs: []Run{
		{Addr: 0x10000, Pages: 1, FirstBlock: 0},
		{Addr: 0x11000, Pages: 3, FirstBlock: 1},
		{Addr: 0x20000, Pages: 2, FirstBlock: 3},
	}, Blocks: []BlockRecord{
		{Kind: 0}, {Kind: 0}, {Kind: 1, StoredLen: 4096, CRC: 1}, {Kind: 2, StoredLen: 100, CRC: 2},
	}}
	b, err := ix.MarshalBinary()
	if err != nil {
		panic(err)
	}
	return b
}

// FuzzIndex: any bytes either parse into an index whose layout checks, or
// fail with an error; never a panic or an unbounded allocation.
func FuzzIndex(f *testing.F) {
	good := seedIndex()
	f.Add(good, int64(4196))
	f.Add(good[:63], int64(-1))
	f.Add([]byte("LZFSPIDX"), int64(0))
	f.Fuzz(func(t *testing.T, b []byte, pagesSize int64) {
		ix, err := UnmarshalIndex(b, pagesSize)
		if err != nil {
			return
		}
		l, err := newLayout(ix)
		if err != nil {
			return
		}
		for ri, r := range ix.Runs {
			blk, ok := l.blockAt(r.Addr)
			if !ok || blk.Index != r.FirstBlock || l.runOfBlock(blk.Index) != ri {
				t.Fatalf("run %d: block at start %+v %v", ri, blk, ok)
			}
			if blk.Off+uint64(blk.StoredLen) > ix.PagesSize {
				t.Fatalf("block %d past the pages file", blk.Index)
			}
		}
	})
}

// FuzzManifest: parseManifest never panics and accepts only manifests
// whose file names are plain names.
func FuzzManifest(f *testing.F) {
	m := Manifest{Format: manifestFormat, Version: 1, PageSize: 4096, BlockSize: 262144,
		Processes: []ProcessEntry{{PID: 1, State: "process-1.json", Index: "pagemap-1.img", Pages: "pages-1.img"}},
		Files:     map[string]FileSum{"process-1.json": {Size: 1, CRC32C: "0"}, "pagemap-1.img": {Size: 64, CRC32C: "0"}, "pages-1.img": {Size: 0, CRC32C: "0"}}}
	b, _ := json.Marshal(m)
	f.Add(b)
	f.Add([]byte(`{"format":"lazyfs-snapshot","version":1}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseManifest(b)
		if err != nil {
			return
		}
		for _, p := range m.Processes {
			for _, n := range []string{p.State, p.Index, p.Pages} {
				if !safeName.MatchString(n) {
					t.Fatalf("accepted file name %q", n)
				}
			}
		}
	})
}

// FuzzState: process state JSON decodes or fails, never panics.
func FuzzState(f *testing.F) {
	b, _ := json.Marshal(&Process{PID: 3, Threads: []Thread{{TID: 3, XState: []byte{1, 2}}}, VMAs: []VMA{{Start: 4096, End: 8192, Kind: VMAAnon}}})
	f.Add(b)
	f.Add([]byte(`{"pid":1,"threads":[{"xstate":"!!"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Process
		_ = json.Unmarshal(b, &p)
	})
}
