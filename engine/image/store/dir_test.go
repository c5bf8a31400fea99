package store_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/lazyfs/lazyfs/engine/image/store"
	"github.com/lazyfs/lazyfs/engine/image/store/storetest"
)

// TestDirConformance: a snapshot directory is a store like any other.
func TestDirConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, files map[string][]byte) store.Store {
		dir := filepath.Join(t.TempDir(), "snap")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		st, err := store.Open(dir, false, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return st
	})
}
