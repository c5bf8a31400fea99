package fs

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/cache"
	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/imagetest"
)

// TestServedBlocksLeaveCache: through a real mount, a block that the
// kernel's page cache received whole leaves the block cache (the page
// cache holds it), one it received in part stays until the rest is read;
// a file opened with O_DIRECT keeps its blocks cached (nothing of it is
// in the page cache); reads are right throughout.
func TestServedBlocksLeaveCache(t *testing.T) {
	const pid, blk = 31, 64 << 10
	start := uint64(0x100000)
	vma := imagetest.VMA{Start: start, End: start + 64*blk, Prot: protRW, Content: imagetest.Text} // LZ4 blocks
	s, err := imagetest.Write(filepath.Join(t.TempDir(), "snap"), image.Options{BlockSize: blk, Mode: codec.Compress},
		imagetest.Process{PID: pid, Seed: 9, VMAs: []imagetest.VMA{vma}})
	if err != nil {
		t.Fatal(err)
	}
	// A cache too small for the server to decode ahead of sequential
	// reads (minReadaheadCache): it holds what the reads decoded, no more.
	srv, _ := mount(t, s.Dir, Options{CacheSize: 32 << 20})
	r := srv.procs[0].r
	if st := r.Stats(); st.LZ4.Blocks != 64 {
		t.Fatalf("test snapshot: %+v, want 64 LZ4 blocks", st)
	}
	mem := filepath.Join(srv.Mountpoint(), strconv.Itoa(pid), "mem")
	f, err := os.Open(mem)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// No readahead: the kernel asks for exactly the pages read.
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM); err != nil {
		t.Fatal(err)
	}
	pread := func(f *os.File, addr uint64, n int) {
		t.Helper()
		b := make([]byte, n)
		if _, err := f.ReadAt(b, int64(addr)); err != nil {
			t.Fatalf("pread %#x+%d: %v", addr, n, err)
		}
		if !bytes.Equal(b, s.Memory(pid, addr, n)) {
			t.Fatalf("pread %#x+%d: wrong bytes", addr, n)
		}
	}
	stats := func(what string, entries, served int64) cache.Stats {
		t.Helper()
		cs := r.CacheStats()
		if cs.Entries != entries || cs.Served != served {
			t.Fatalf("%s: %d blocks cached, %d left served whole; want %d and %d (%+v)", what, cs.Entries, cs.Served, entries, served, cs)
		}
		return cs
	}

	b3 := start + 3*blk
	pread(f, b3, 16<<10)
	stats("16 KiB of a block read", 1, 0)
	pread(f, b3+16<<10, 16<<10)
	stats("32 KiB of it", 1, 0)
	if n := resident(t, f, b3, blk); n != 8 {
		t.Fatalf("%d pages of the block in the page cache, want 8", n)
	}
	pread(f, b3+32<<10, 32<<10)
	cs := stats("all of it", 0, 1)
	if cs.Bytes != 0 {
		t.Fatalf("no block cached, yet %d bytes counted", cs.Bytes)
	}
	if n := resident(t, f, b3, blk); n != 16 {
		t.Fatalf("%d pages of the block in the page cache, want 16", n)
	}
	pread(f, b3, blk) // from the page cache: nothing decoded again
	if cs := stats("the block again", 0, 1); cs.Misses != 1 {
		t.Fatalf("the block decoded %d times, want once", cs.Misses)
	}

	// O_DIRECT: the replies go to the reader only; the cache keeps them.
	d, err := os.OpenFile(mem, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	buf := alignedBuf(blk)
	if _, err := d.ReadAt(buf, int64(start+5*blk)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, s.Memory(pid, start+5*blk, blk)) {
		t.Fatal("O_DIRECT read: wrong bytes")
	}
	stats("a block read with O_DIRECT", 1, 1)

	// A whole read of the file: every block is served whole, and leaves.
	all, err := os.ReadFile(mem)
	if err != nil {
		t.Fatal(err)
	}
	if uint64(len(all)) != vma.End || !bytes.Equal(all[start:], s.Memory(pid, start, int(vma.End-start))) {
		t.Fatal("whole read: wrong bytes")
	}
	stats("after a whole read", 0, 64)

	// The same with the default cache, which decodes ahead of a reader
	// that reads in order: what it decoded ahead is read, and leaves.
	srv, _ = mount(t, s.Dir, Options{})
	mem = filepath.Join(srv.Mountpoint(), strconv.Itoa(pid), "mem")
	if all, err = os.ReadFile(mem); err != nil || !bytes.Equal(all[start:], s.Memory(pid, start, int(vma.End-start))) {
		t.Fatalf("whole read, default cache: wrong bytes (%v)", err)
	}
	r = srv.procs[0].r
	deadline := time.Now().Add(10 * time.Second)
	for {
		// A block that readahead decoded as the reader read it can stay
		// (a few, more under the race detector's slower timing: 4 of 64
		// in one run); without the served blocks leaving, all 64 would.
		cs := r.CacheStats()
		if cs.Served >= 56 && cs.Entries <= 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a whole read with the default cache: %d blocks cached, %d left served whole (%+v)", cs.Entries, cs.Served, cs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// resident counts the pages of [addr, addr+n) of f in the page cache.
func resident(t *testing.T, f *os.File, addr uint64, n int) int {
	t.Helper()
	m, err := unix.Mmap(int(f.Fd()), int64(addr), n, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, n/imagetest.PageSize)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(n), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	k := 0
	for _, v := range vec {
		k += int(v & 1)
	}
	return k
}

// alignedBuf returns n bytes aligned to a page, for O_DIRECT.
func alignedBuf(n int) []byte {
	b := make([]byte, n+imagetest.PageSize)
	off := int(uintptr(unsafe.Pointer(&b[0])) & (imagetest.PageSize - 1))
	if off != 0 {
		off = imagetest.PageSize - off
	}
	return b[off : off+n]
}
