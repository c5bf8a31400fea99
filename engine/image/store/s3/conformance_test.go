package s3_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/lazyfs/lazyfs/engine/image/store"
	"github.com/lazyfs/lazyfs/engine/image/store/s3"
	"github.com/lazyfs/lazyfs/engine/image/store/storetest"
)

// TestConformance: a snapshot in an object store is a store like any
// other, read straight from the store or through a cache directory.
func TestConformance(t *testing.T) {
	_, o, _ := setup(t)
	n := 0
	for _, cached := range []bool{false, true} {
		t.Run(fmt.Sprintf("cache directory %v", cached), func(t *testing.T) {
			storetest.Run(t, func(t *testing.T, files map[string][]byte) store.Store {
				n++
				addr := fmt.Sprintf("s3://snaps/conformance/%d", n)
				w, err := s3.Create(addr, o)
				if err != nil {
					t.Fatal(err)
				}
				for name, b := range files {
					if name == storetest.ManifestName {
						continue
					}
					up, err := w.Create(name)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := up.Write(b); err != nil {
						t.Fatal(err)
					}
					if err := up.Close(); err != nil {
						t.Fatal(err)
					}
				}
				if err := w.Commit(files[storetest.ManifestName]); err != nil {
					t.Fatal(err)
				}
				ro := o
				if cached {
					ro.CacheDir = filepath.Join(t.TempDir(), "cache")
				}
				st, err := s3.Open(addr, ro)
				if err != nil {
					t.Fatal(err)
				}
				return st
			})
		})
	}
}

// TestWriterConformance: a dump writes to an object store as to any
// store.
func TestWriterConformance(t *testing.T) {
	_, o, _ := setup(t)
	addr := func(place string) string { return "s3://snaps/writer/" + place }
	storetest.RunWriter(t, storetest.Writable{
		Create: func(place string) (store.StoreWriter, error) { return s3.Create(addr(place), o) },
		Open:   func(place string) (store.Store, error) { return s3.Open(addr(place), o) },
	})
}
