package storetest

import (
	"errors"
	"os"
	"testing"

	"github.com/lazyfs/lazyfs/engine/image/store"
)

// Writable is a store a dump can write to, for RunWriter.
type Writable struct {
	// Create starts a dump to place, a plain name: each subtest uses
	// places of its own, fresh, and names one again to mean the same.
	Create func(place string) (store.StoreWriter, error)
	// Open opens what place holds for reading.
	Open func(place string) (store.Store, error)
}

// RunWriter checks the StoreWriter of w: files written come back whole,
// the manifest by Commit; an upload aborted leaves nothing, a dump
// aborted leaves nothing, and a place that holds a snapshot is refused
// (store.ErrExists).
func RunWriter(t *testing.T, w Writable) {
	files := Files()
	opened := func(t *testing.T, place string) store.Store {
		t.Helper()
		st, err := w.Open(place)
		if err != nil {
			t.Fatalf("open %s: %v", place, err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	t.Run("commit", func(t *testing.T) {
		dw := create(t, w, "commit")
		writeAll(t, dw, files)
		if err := dw.Commit(files[ManifestName]); err != nil {
			t.Fatalf("commit: %v", err)
		}
		st := opened(t, "commit")
		checkStat(t, st, files)
		for _, name := range names(files) {
			checkReads(t, st, name, files[name])
		}
	})
	t.Run("upload aborted", func(t *testing.T) {
		dw := create(t, w, "upload-aborted")
		up, err := dw.Create("pages-1.img")
		if err != nil {
			t.Fatal(err)
		}
		// Larger than an object store's part (16 MiB): aborted after
		// parts went up.
		big := random(17<<20+1, 5)
		for off := 0; off < len(big); off += 1 << 20 {
			if _, err := up.Write(big[off:min(len(big), off+1<<20)]); err != nil {
				t.Fatal(err)
			}
		}
		up.Abort()
		writeAll(t, dw, map[string][]byte{"process-1.json": files["process-1.json"]})
		if err := dw.Commit(files[ManifestName]); err != nil {
			t.Fatalf("commit: %v", err)
		}
		st := opened(t, "upload-aborted")
		if _, err := st.Stat("pages-1.img"); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("an aborted upload: Stat says %v, want os.ErrNotExist", err)
		}
		checkStat(t, st, map[string][]byte{"process-1.json": files["process-1.json"], ManifestName: files[ManifestName]})
	})
	t.Run("dump aborted", func(t *testing.T) {
		dw := create(t, w, "dump-aborted")
		writeAll(t, dw, files)
		dw.Abort()
		st := opened(t, "dump-aborted")
		for _, name := range names(files) {
			if _, err := st.Stat(name); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s after an aborted dump: Stat says %v, want os.ErrNotExist", name, err)
			}
		}
		// Nothing is left to stop the next dump there.
		again := create(t, w, "dump-aborted")
		again.Abort()
	})
	t.Run("snapshot there", func(t *testing.T) {
		dw := create(t, w, "exists")
		writeAll(t, dw, map[string][]byte{"process-1.json": files["process-1.json"]})
		if err := dw.Commit(files[ManifestName]); err != nil {
			t.Fatalf("commit: %v", err)
		}
		if again, err := w.Create("exists"); !errors.Is(err, store.ErrExists) {
			if err == nil {
				again.Abort()
			}
			t.Errorf("a dump to a place holding a snapshot: %v, want store.ErrExists", err)
		}
		st := opened(t, "exists")
		checkStat(t, st, map[string][]byte{"process-1.json": files["process-1.json"], ManifestName: files[ManifestName]})
	})
}

func create(t *testing.T, w Writable, place string) store.StoreWriter {
	t.Helper()
	dw, err := w.Create(place)
	if err != nil {
		t.Fatalf("create %s: %v", place, err)
	}
	if dw.String() == "" {
		t.Error("String is empty: messages would not name the snapshot")
	}
	return dw
}

// writeAll writes every file but the manifest, each in pieces whose
// bounds fall on no power of two.
func writeAll(t *testing.T, dw store.StoreWriter, files map[string][]byte) {
	t.Helper()
	for _, name := range names(files) {
		if name == ManifestName {
			continue
		}
		up, err := dw.Create(name)
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		for b := files[name]; len(b) > 0; {
			n := min(len(b), 777777)
			if _, err := up.Write(b[:n]); err != nil {
				t.Fatalf("write %s: %v", name, err)
			}
			b = b[n:]
		}
		if err := up.Close(); err != nil {
			t.Fatalf("close %s: %v", name, err)
		}
	}
}
