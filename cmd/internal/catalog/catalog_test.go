package catalog

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/imagetest"
)

// writeSnapshot writes a small snapshot at dir, incremental on parent if
// parent is not "".
func writeSnapshot(t *testing.T, dir, parent string) {
	t.Helper()
	_, err := imagetest.Write(dir, image.Options{BlockSize: 64 << 10, Mode: codec.NoCompress, Parent: parent},
		imagetest.Process{PID: 7, Seed: 1, VMAs: []imagetest.VMA{
			{Start: 0x7f0000000000, End: 0x7f0000000000 + 16<<12, Prot: unix.PROT_READ | unix.PROT_WRITE, Content: imagetest.Random},
		}})
	if err != nil {
		t.Fatal(err)
	}
}

// TestListAndRemove lists a directory holding a snapshot, an incremental
// child of it, a dump's leftovers and an unrelated directory, then
// removes them as snapctl rm does.
func TestListAndRemove(t *testing.T) {
	root := t.TempDir()
	base, child := filepath.Join(root, "base"), filepath.Join(root, "child")
	writeSnapshot(t, base, "")
	writeSnapshot(t, child, base)
	left := filepath.Join(root, "left")
	if err := os.Mkdir(left, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(left, "pages-7.img"), []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(root, "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}

	entries, err := List(root)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Entry{}
	for _, e := range entries {
		got[e.Name] = e
	}
	if len(got) != 3 || got["base"].State != "complete" || got["child"].Parent != base ||
		!strings.HasPrefix(got["left"].State, "incomplete") || got["base"].Processes != 1 || got["base"].Memory != 16<<12 {
		t.Fatalf("List(%s) = %+v", root, entries)
	}
	if one, err := List(base); err != nil || len(one) != 1 || one[0].Name != base {
		t.Fatalf("List(%s) = %+v, %v: want the snapshot itself", base, one, err)
	}

	var out bytes.Buffer
	if err := Remove(other, false, nil, &out); err == nil {
		t.Errorf("Remove of a directory that is no snapshot: no error")
	}
	if err := Remove(base, false, []string{base}, &out); err == nil || !strings.Contains(err.Error(), "parent of incremental snapshot "+child) {
		t.Errorf("Remove of a parent: %v, want a refusal naming %s", err, child)
	}
	if err := Remove(base, false, []string{base, child}, &out); err != nil {
		t.Errorf("Remove of a parent removed with its child: %v", err)
	}
	if err := os.WriteFile(filepath.Join(child, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Remove(child, true, nil, &out); err != nil {
		t.Fatal(err)
	}
	if names, _ := os.ReadDir(child); len(names) != 1 || names[0].Name() != "notes.txt" {
		t.Errorf("after Remove, %s holds %v: want only the file that is not the snapshot's", child, names)
	}
	if err := Remove(left, false, nil, &out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a dump's leftovers: %s still there (%v)", left, err)
	}
}

// TestRemoveLocked: a directory a dump holds locked is refused.
func TestRemoveLocked(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	writeSnapshot(t, dir, "")
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if err := Remove(dir, false, nil, &bytes.Buffer{}); !errors.Is(err, image.ErrLocked) {
		t.Errorf("Remove of a locked snapshot: %v, want image.ErrLocked", err)
	}
}
