package image

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
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
