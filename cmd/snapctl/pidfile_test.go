package main

import (
	"os"
	"path/filepath"
	"testing"
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
