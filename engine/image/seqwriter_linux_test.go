package image

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestSeqWriter writes pieces of every size, some larger than the buffer,
// ending aligned and unaligned, and reads the file back.
func TestSeqWriter(t *testing.T) {
	for _, total := range []int{0, 100, directAlign, seqBufSize, seqBufSize + directAlign, 2*seqBufSize + 12345} {
		path := filepath.Join(t.TempDir(), "f")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		w := newSeqWriter(f)
		rng := rand.New(rand.NewPCG(uint64(total), 7))
		want := make([]byte, total)
		for i := range want {
			want[i] = byte(rng.Uint32())
		}
		for off := 0; off < total; {
			n := min(total-off, 1+rng.IntN(seqBufSize*3/2))
			if rng.IntN(3) == 0 {
				n = min(total-off, 1+rng.IntN(5000))
			}
			if got, err := w.Write(want[off : off+n]); err != nil || got != n {
				t.Fatalf("total %d: Write %d at %d: %d, %v", total, n, off, got, err)
			}
			off += n
		}
		if err := w.Flush(); err != nil {
			t.Fatalf("total %d: Flush: %v", total, err)
		}
		if w.off != uint64(total) {
			t.Fatalf("total %d: %d written", total, w.off)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("total %d: file of %d bytes differs from what was written", total, len(got))
		}
		t.Logf("total %d: direct at the end: %v", total, w.direct)
	}
}

// TestSeqWriterAbort: a writer stopped without its tail returns at once,
// with the whole buffers it had written.
func TestSeqWriterAbort(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := newSeqWriter(f)
	if _, err := w.Write(make([]byte, seqBufSize+100)); err != nil {
		t.Fatal(err)
	}
	w.Abort()
	if st, err := f.Stat(); err != nil || st.Size() != seqBufSize {
		t.Fatalf("after Abort the file holds %v bytes (%v), want %d", st.Size(), err, seqBufSize)
	}
}

// TestSeqWriterBypassesPageCache: where the filesystem takes O_DIRECT,
// the whole buffers written leave no page of the file in the page cache
// (only the unaligned tail goes through it).
func TestSeqWriterBypassesPageCache(t *testing.T) {
	dir := t.TempDir()
	probe, err := os.OpenFile(filepath.Join(dir, "probe"), os.O_CREATE|os.O_WRONLY|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Skipf("the filesystem of %s refuses O_DIRECT (%v): nothing to check", dir, err)
	}
	probe.Close()
	path := filepath.Join(dir, "f")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := newSeqWriter(f)
	const total = 2*seqBufSize + 100
	if _, err := w.Write(make([]byte, total)); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, total, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (total+PageSize-1)/PageSize)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatalf("mincore: %v", e)
	}
	var resident int
	for _, v := range vec[:2*seqBufSize/PageSize] {
		resident += int(v & 1)
	}
	if resident > 0 {
		t.Errorf("%d of the %d pages written in whole buffers are in the page cache", resident, 2*seqBufSize/PageSize)
	}
}
