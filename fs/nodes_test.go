package fs

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/lazyfs/lazyfs/cache"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/imagetest"
)

// Node tests call the FUSE node methods directly, without a mount.

func openTestProcess(t testing.TB, s *imagetest.Snapshot, pid int) *process {
	t.Helper()
	snap, err := image.Open(s.Dir)
	if err != nil {
		t.Fatal(err)
	}
	p, err := openProcess(snap, pid, image.ReaderOptions{Cache: cache.New(16 << 20), Threads: 1, Readahead: true}, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.r.Close() })
	return p
}

func readNode(t testing.TB, m *memNode, off int64, n int) []byte {
	t.Helper()
	res, errno := m.Read(context.Background(), nil, make([]byte, n), off)
	if errno != 0 {
		t.Fatalf("read %#x+%d: %v", off, n, errno)
	}
	b, st := res.Bytes(nil)
	if st != fuse.OK {
		t.Fatalf("read result: %v", st)
	}
	return b
}

func TestMemNodeReads(t *testing.T) {
	for _, bs := range []int{4 << 10, 64 << 10, 1 << 20, 4 << 20} {
		t.Run(fmt.Sprintf("block=%dK", bs>>10), func(t *testing.T) {
			s := writeSnapshot(t, bs)
			p := openTestProcess(t, s, pidA)
			own := &owner{}
			mem := newMemNode(own, p, 0, p.memSize(), fuse.FOPEN_KEEP_CACHE)
			vmas := layout()
			last := vmas[len(vmas)-1]
			if mem.size != last.End {
				t.Fatalf("mem size %#x, want end of the last VMA %#x", mem.size, last.End)
			}
			var out fuse.AttrOut
			mem.Getattr(context.Background(), nil, &out)
			if want := s.DumpedBytes(pidA) / 512; out.Blocks != want {
				t.Errorf("st_blocks %d, want %d", out.Blocks, want)
			}
			if out.Mode != syscall.S_IFREG|0o400 {
				t.Errorf("mode %o", out.Mode)
			}
			// random reads, straddling blocks, runs, holes and VMAs
			r := rand.New(rand.NewPCG(uint64(bs), 9))
			lo, hi := vmas[0].Start-pages(2), last.End
			for i := 0; i < 200; i++ {
				off := lo + r.Uint64N(hi-lo)
				if i%3 == 0 { // near a block boundary
					off = (off/uint64(bs)+1)*uint64(bs) - uint64(r.IntN(64))
				}
				n := 1 + r.IntN(min(3*bs, 2<<20)) // reads straddle blocks of every size
				got := readNode(t, mem, int64(off), n)
				want := s.Memory(pidA, off, int(min(uint64(n), mem.size-min(off, mem.size))))
				if !bytes.Equal(got, want) {
					t.Fatalf("read %#x+%d differs", off, n)
				}
			}
			// regions: one window per dumped VMA
			for _, v := range vmas {
				if v.NotDumped {
					continue
				}
				reg := newMemNode(own, p, v.Start, v.End-v.Start, fuse.FOPEN_KEEP_CACHE)
				got := readNode(t, reg, 0, int(v.End-v.Start)+4096)
				if !bytes.Equal(got, s.Memory(pidA, v.Start, int(v.End-v.Start))) {
					t.Fatalf("region %#x-%#x differs", v.Start, v.End)
				}
				if got := readNode(t, reg, int64(v.End-v.Start), 100); len(got) != 0 {
					t.Fatalf("read at the end of a region returned %d bytes", len(got))
				}
			}
		})
	}
}

// seekAll enumerates the data ranges of a node with SEEK_DATA/SEEK_HOLE.
func seekAll(t testing.TB, seek func(off uint64, whence uint32) (uint64, syscall.Errno)) [][2]uint64 {
	t.Helper()
	var out [][2]uint64
	var off uint64
	for i := 0; ; i++ {
		if i > 10000 {
			t.Fatal("SEEK_DATA/SEEK_HOLE do not advance")
		}
		d, errno := seek(off, seekData)
		if errno == syscall.ENXIO {
			return out
		}
		if errno != 0 || d < off {
			t.Fatalf("SEEK_DATA %#x = %#x, %v", off, d, errno)
		}
		h, errno := seek(d, seekHole)
		if errno != 0 || h <= d {
			t.Fatalf("SEEK_HOLE %#x = %#x, %v", d, h, errno)
		}
		out = append(out, [2]uint64{d, h})
		off = h
	}
}

func TestMemNodeSeek(t *testing.T) {
	s := writeSnapshot(t, 64<<10)
	p := openTestProcess(t, s, pidA)
	mem := newMemNode(&owner{}, p, 0, p.memSize(), 0)
	seek := func(off uint64, whence uint32) (uint64, syscall.Errno) {
		return mem.Lseek(context.Background(), nil, off, whence)
	}
	got, want := seekAll(t, seek), s.Dumped(pidA)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("data ranges\n%x\nwant\n%x", got, want)
	}
	// inside data, SEEK_DATA stays; inside a hole, SEEK_HOLE stays
	r := want[1]
	if d, _ := seek(r[0]+5, seekData); d != r[0]+5 {
		t.Errorf("SEEK_DATA inside data moved to %#x", d)
	}
	if h, _ := seek(r[1]+1, seekHole); h != r[1]+1 {
		t.Errorf("SEEK_HOLE inside a hole moved to %#x", h)
	}
	if _, errno := seek(mem.size, seekHole); errno != syscall.ENXIO {
		t.Errorf("SEEK_HOLE at the end: %v, want ENXIO", errno)
	}
	if _, errno := seek(0, 7); errno != syscall.EINVAL {
		t.Errorf("lseek whence 7: %v, want EINVAL", errno)
	}
	// a region with a leading hole: data starts inside it
	vmas := layout()
	stack := vmas[len(vmas)-1]
	reg := newMemNode(&owner{}, p, stack.Start, stack.End-stack.Start, 0)
	got = seekAll(t, func(off uint64, whence uint32) (uint64, syscall.Errno) {
		return reg.Lseek(context.Background(), nil, off, whence)
	})
	if w := [][2]uint64{{pages(100), stack.End - stack.Start}}; fmt.Sprint(got) != fmt.Sprint(w) {
		t.Errorf("stack region data %x, want %x", got, w)
	}
}

func TestStatsText(t *testing.T) {
	s := writeSnapshot(t, 64<<10)
	p := openTestProcess(t, s, pidA)
	readNode(t, newMemNode(&owner{}, p, 0, p.memSize(), 0), int64(base), 1<<20)
	txt := string(statsText(p))
	st := p.r.Stats()
	for _, want := range []string{
		fmt.Sprintf("pid %d", pidA),
		fmt.Sprintf("blocks_zero %d", st.Zero.Blocks),
		fmt.Sprintf("blocks_raw %d", st.Raw.Blocks),
		fmt.Sprintf("blocks_lz4 %d", st.LZ4.Blocks),
		fmt.Sprintf("original_bytes %d", s.DumpedBytes(pidA)),
		fmt.Sprintf("stored_bytes %d", st.FileSize),
		fmt.Sprintf("ratio %.4f", st.Ratio()),
		"cache_misses", "cache_hits", "cache_evictions", "cache_served",
	} {
		if !strings.Contains(strings.Join(strings.Fields(txt), " "), want) {
			t.Errorf("stats lack %q:\n%s", want, txt)
		}
	}
	if st.Zero.Blocks == 0 || st.Raw.Blocks == 0 || st.LZ4.Blocks == 0 {
		t.Errorf("test snapshot lacks a block kind: %+v", st)
	}
	if cs := p.r.CacheStats(); cs.Misses == 0 {
		t.Errorf("a read of 1 MiB missed no block: %+v", cs)
	}
}
