package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/engine/image"
)

// TestPidfileIgnoresLinks: links planted at the pidfile's path and at the
// temporary name an earlier build used, both pointing at a file that is
// not the pidfile's to write: the files stay as they were and the pidfile
// is a new regular file.
func TestPidfileIgnoresLinks(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("root's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "restore.pid")
	for _, l := range []string{path, path + ".tmp"} {
		if err := os.Symlink(secret, l); err != nil {
			t.Fatal(err)
		}
	}
	if err := writePidfile(path, 4242); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "root's\n" {
		t.Errorf("the link's target was written: %q", b)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Errorf("pidfile is %v, want a regular file, mode 0644", fi.Mode())
	}
	if b, _ := os.ReadFile(path); string(b) != "4242\n" {
		t.Errorf("pidfile holds %q", b)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 3 { // secret, the pidfile, the old link
		t.Errorf("files left: %v", ents)
	}
}

// TestPidfileDirectory: a pidfile is written only into a directory no
// other user can rename things in: another user's directory, and one
// that group or others can write and is not sticky, are refused naming
// it; a sticky world-writable one (/tmp) is fine.
func TestPidfileDirectory(t *testing.T) {
	base := t.TempDir()
	open := filepath.Join(base, "open")
	sticky := filepath.Join(base, "sticky")
	for _, d := range []string{open, sticky} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sticky, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	err := writePidfile(filepath.Join(open, "restore.pid"), 1)
	if !errors.Is(err, image.ErrUntrusted) || !strings.Contains(err.Error(), "not sticky") {
		t.Errorf("a world-writable directory: %v, want ErrUntrusted", err)
	}
	if err := writePidfile(filepath.Join(sticky, "restore.pid"), 1); err != nil {
		t.Errorf("a sticky directory: %v", err)
	}
	if os.Geteuid() == 0 {
		other := filepath.Join(base, "other")
		if err := os.Mkdir(other, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		err := writePidfile(filepath.Join(other, "restore.pid"), 1)
		if !errors.Is(err, image.ErrUntrusted) || !strings.Contains(err.Error(), "belongs to uid 65534") {
			t.Errorf("another user's directory: %v, want ErrUntrusted", err)
		}
	}
	if names, _ := filepath.Glob(filepath.Join(base, "*", ".restore.pid.*")); len(names) != 0 {
		t.Errorf("temporary files left: %v", names)
	}
}
