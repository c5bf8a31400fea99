package archive

import (
	"archive/tar"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lazyfs/lazyfs/engine/image/store"
	"github.com/lazyfs/lazyfs/engine/image/store/storetest"
)

// TestConformance: an archive read in place is a store like any other.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, files map[string][]byte) store.Store {
		path := filepath.Join(t.TempDir(), "snap.tar")
		out, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		tw := tar.NewWriter(out)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "snap/", Mode: 0o700})
		names := make([]string, 0, len(files))
		for name := range files {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			b := files[name]
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "snap/" + name, Mode: 0o600, Size: int64(len(b))}); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write(b); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		st, err := Open(f)
		if err != nil {
			f.Close()
			t.Fatal(err)
		}
		return st
	})
}
