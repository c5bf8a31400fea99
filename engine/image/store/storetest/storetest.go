// Package storetest is the conformance suite of stores: what every
// store.Store, and every store.StoreWriter, must do, whatever holds the
// bytes, as rclone's fstests checks every backend. A store's own tests
// run it with a function that makes a store of theirs holding given
// files (Run), and, for a store a dump can write to, with functions that
// start a dump and open what it left (RunWriter).
package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/lazyfs/lazyfs/engine/image/store"
)

// ManifestName is the file a StoreWriter stores last, by Commit (the
// format's snapshot.json).
const ManifestName = "snapshot.json"

// Files returns the files a store under test holds: a manifest, a small
// file, an empty one, and one large enough to span several of an object
// store's chunks (1 MiB), whose length falls on no boundary.
func Files() map[string][]byte {
	return map[string][]byte{
		ManifestName:       []byte("{\"version\":1}\n"),
		"process-1.json":   []byte(`{"pid":1}`),
		"workingset-1.img": {},
		"pages-1.img":      random(5<<19+12345, 1),
		"pagemap-1.img":    random(4096, 2),
		"digests-1.img":    random(1, 3),
		"keys.age":         random(333, 4),
		"process-42.json":  []byte("x"),
	}
}

func random(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// Run checks the store that open makes, holding files (Files()): sizes,
// reads at any offset and their ends, missing files, concurrent reads,
// and files that outlive their store. open is called once per subtest;
// the suite closes what it returns.
func Run(t *testing.T, open func(t *testing.T, files map[string][]byte) store.Store) {
	files := Files()
	opened := func(t *testing.T) store.Store {
		t.Helper()
		st := open(t, files)
		t.Cleanup(func() { st.Close() })
		if st.String() == "" {
			t.Error("String is empty: messages would not name the snapshot")
		}
		return st
	}
	t.Run("stat", func(t *testing.T) { checkStat(t, opened(t), files) })
	t.Run("missing", func(t *testing.T) { checkMissing(t, opened(t)) })
	t.Run("read at offsets", func(t *testing.T) {
		st := opened(t)
		for _, name := range names(files) {
			checkReads(t, st, name, files[name])
		}
	})
	t.Run("concurrent reads", func(t *testing.T) { checkConcurrent(t, opened(t), "pages-1.img", files["pages-1.img"]) })
	t.Run("files outlive the store", func(t *testing.T) {
		st := opened(t)
		f, err := st.Open("pages-1.img")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := st.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		want := files["pages-1.img"]
		got := make([]byte, 3<<19)
		if n, err := f.ReadAt(got, 1<<19); n != len(got) || (err != nil && err != io.EOF) || !bytes.Equal(got, want[1<<19:1<<19+len(got)]) {
			t.Errorf("read after the store closed: %d bytes, %v", n, err)
		}
	})
}

func names(files map[string][]byte) []string {
	out := make([]string, 0, len(files))
	for name := range files {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// checkStat: every file has its size.
func checkStat(t *testing.T, st store.Store, files map[string][]byte) {
	for _, name := range names(files) {
		size, err := st.Stat(name)
		if err != nil || size != int64(len(files[name])) {
			t.Errorf("Stat(%s) = %d, %v; want %d", name, size, err, len(files[name]))
		}
	}
}

// checkMissing: a file the store does not hold is os.ErrNotExist, for
// Stat and Open, in an error that names it and the snapshot.
func checkMissing(t *testing.T, st store.Store) {
	const name = "pages-7.img"
	_, serr := st.Stat(name)
	_, oerr := st.Open(name)
	for op, err := range map[string]error{"Stat": serr, "Open": oerr} {
		if !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s of a missing file: %v, want os.ErrNotExist", op, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, name) || !strings.Contains(msg, st.String()) {
			t.Errorf("%s of a missing file: %q names neither the file nor %s", op, msg, st.String())
		}
	}
}

// checkReads reads the file name, holding want, at offsets inside it,
// across its end and past it, as io.ReaderAt says: a short read is
// io.EOF, never other bytes.
func checkReads(t *testing.T, st store.Store, name string, want []byte) {
	f, err := st.Open(name)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	defer f.Close()
	size := len(want)
	type span struct{ off, n int }
	spans := []span{{0, size}, {0, 1}, {size / 2, size / 3}, {size - 1, 1}, {1<<20 - 7, 14}, {size - 5, 10}, {size, 1}, {size + 100, 1}}
	for _, s := range spans {
		if s.off < 0 || s.n <= 0 {
			continue
		}
		got := make([]byte, s.n)
		n, err := f.ReadAt(got, int64(s.off))
		end := min(s.off+s.n, size)
		inside := max(end-s.off, 0)
		if n != inside || !bytes.Equal(got[:n], want[min(s.off, size):end]) {
			t.Errorf("%s: ReadAt(%d bytes at %d) = %d bytes, %v; want the file's %d", name, s.n, s.off, n, err, inside)
			continue
		}
		switch {
		case inside < s.n && err != io.EOF:
			t.Errorf("%s: a read of %d bytes at %d past the end (%d): %v, want io.EOF", name, s.n, s.off, size, err)
		case inside == s.n && err != nil && err != io.EOF:
			t.Errorf("%s: ReadAt(%d bytes at %d): %v", name, s.n, s.off, err)
		}
	}
}

// checkConcurrent reads the file name from several goroutines at once,
// each its own ranges.
func checkConcurrent(t *testing.T, st store.Store, name string, want []byte) {
	f, err := st.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for range 32 {
				off := r.IntN(len(want))
				n := 1 + r.IntN(min(len(want)-off, 300<<10))
				got := make([]byte, n)
				if m, err := f.ReadAt(got, int64(off)); m != n || (err != nil && err != io.EOF) || !bytes.Equal(got, want[off:off+n]) {
					errs <- fmt.Errorf("ReadAt(%d bytes at %d) = %d, %v, or other bytes", n, off, m, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("%s: %v", name, err)
	}
}
