package store_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

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

// TestDirRefuses: a snapshot directory's file is a regular file, never
// reached through a link, and (unless trusted) one only the caller and
// root can change; so is the directory itself.
func TestDirRefuses(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(name string, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("data"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, name), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("good", 0o600)
	write("shared", 0o666)
	if err := os.Symlink("good", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(dir, false, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Stat("good"); err != nil {
		t.Errorf("a file of the caller's: %v", err)
	}
	for name, want := range map[string]error{"shared": store.ErrUntrusted, "link": store.ErrCorrupt, "fifo": store.ErrCorrupt} {
		if _, err := st.Stat(name); !errors.Is(err, want) {
			t.Errorf("Stat(%s): %v, want %v", name, err, want)
		}
	}
	if _, err := st.Open("link"); !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("Open through a link: %v, want ErrCorrupt", err)
	}
	trusted, err := store.Open(dir, true, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer trusted.Close()
	if _, err := trusted.Stat("shared"); err != nil {
		t.Errorf("a file others can write, trusted: %v", err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Open(dir, false, store.Options{}); !errors.Is(err, store.ErrUntrusted) {
		t.Errorf("a directory others can write: %v, want ErrUntrusted", err)
	}
	// A regular file where a directory is expected is an archive, which
	// this build (no archive store registered) cannot open.
	if _, err := store.Open(filepath.Join(dir, "good"), true, store.Options{}); err == nil || !strings.Contains(err.Error(), "neither a directory nor a snapshot archive") {
		t.Errorf("a file, no archive store: %v", err)
	}
	if _, err := store.Open("nope://bucket/x", false, store.Options{}); err == nil || !strings.Contains(err.Error(), "no store for addresses nope://") {
		t.Errorf("an address of no registered scheme: %v", err)
	}
}
