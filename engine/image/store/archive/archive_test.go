package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/imagetest"
	"github.com/lazyfs/lazyfs/engine/image/workingset"
)

const pid = 4242

// snapshot writes a synthetic snapshot of one process whose blocks are of
// every kind, and returns it.
func snapshot(t *testing.T) *imagetest.Snapshot {
	t.Helper()
	s, err := imagetest.Write(filepath.Join(t.TempDir(), "snap"), image.Options{BlockSize: 64 << 10, Mode: codec.Compress},
		imagetest.Process{PID: pid, Seed: 7, VMAs: []imagetest.VMA{
			{Start: 0x10000000, End: 0x10400000, Prot: 3, Content: imagetest.Patchwork},
			{Start: 0x20000000, End: 0x20100000, Prot: 3, Content: imagetest.Text, Holes: [][2]uint64{{0x1000, 0x3000}}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// export writes the archive of the snapshot in dir into a file, 0600.
func export(t *testing.T, dir string) string {
	t.Helper()
	st, err := image.OpenStore(dir, image.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	file := filepath.Join(t.TempDir(), "snap.tar")
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	if err := Write(context.Background(), st, "snap", f, func(done, total uint64) { last = done }); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if fi, _ := os.Stat(file); last == 0 || uint64(fi.Size()) < last {
		t.Errorf("progress ended at %d for an archive of %d bytes", last, fi.Size())
	}
	return file
}

// TestRoundTrip: an archive opens as the snapshot it was made from: same
// manifest, every block verified, the memory byte for byte; its members
// are one directory's, the manifest last.
func TestRoundTrip(t *testing.T) {
	s := snapshot(t)
	file := export(t, s.Dir)

	b, _ := os.ReadFile(file)
	tr := tar.NewReader(bytes.NewReader(b))
	var names []string
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		names = append(names, h.Name)
	}
	if len(names) < 5 || names[0] != "snap/" || names[len(names)-1] != "snap/"+image.ManifestName {
		t.Errorf("members %q: want the directory first and the manifest last", names)
	}

	snap, err := image.OpenWith(file, image.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	orig, err := image.Open(s.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	if !bytes.Equal(snap.ManifestJSON(), orig.ManifestJSON()) {
		t.Error("the archive's manifest differs from the snapshot's")
	}
	r, err := snap.OpenPages(pid, image.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Verify(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if err := snap.VerifyPagesFile(pid); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []uint64{0x10000000, 0x10123000, 0x20000000, 0x200ff000} {
		got := make([]byte, 8192)
		if _, err := r.ReadAt(got, int64(addr)); err != nil {
			t.Fatal(err)
		}
		if want := s.Memory(pid, addr, len(got)); !bytes.Equal(got, want) {
			t.Errorf("memory at %#x differs from the snapshot's", addr)
		}
	}
	if _, err := workingset.Read(snap, pid); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("working set of an archive without one: %v, want not found", err)
	}
}

// TestExportRefusesMismatch: a snapshot whose file no longer matches its
// manifest is not exported.
func TestExportRefusesMismatch(t *testing.T) {
	s := snapshot(t)
	state := filepath.Join(s.Dir, "process-4242.json")
	b, _ := os.ReadFile(state)
	b[len(b)/2] ^= 1
	os.WriteFile(state, b, 0o600)
	st, err := image.OpenStore(s.Dir, image.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := Write(context.Background(), st, "snap", &bytes.Buffer{}, nil); !errors.Is(err, image.ErrCorrupt) {
		t.Errorf("export of a snapshot whose state changed: %v, want ErrCorrupt", err)
	}
}

// TestOpenRefuses: archives that are not one directory of plain files
// within the file, and archives another user could change, are refused;
// a flipped byte in a block is found by the block's checksum.
func TestOpenRefuses(t *testing.T) {
	s := snapshot(t)
	good, _ := os.ReadFile(export(t, s.Dir))
	write := func(t *testing.T, b []byte, mode os.FileMode) string {
		file := filepath.Join(t.TempDir(), "a.tar")
		if err := os.WriteFile(file, b, mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(file, mode)
		return file
	}
	craft := func(members ...tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range members {
			if h.Typeflag == tar.TypeReg {
				h.Size = 4
			}
			tw.WriteHeader(&h)
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte("data"))
			}
		}
		tw.Close()
		return buf.Bytes()
	}
	reg := func(name string) tar.Header { return tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600} }
	for name, b := range map[string][]byte{
		"truncated":       good[:len(good)/2],
		"two directories": craft(reg("a/snapshot.json"), reg("b/pages-1.img")),
		"a path out":      craft(reg("a/../etc/passwd")),
		"a nested path":   craft(reg("a/x/y")),
		"a symbolic link": craft(tar.Header{Typeflag: tar.TypeSymlink, Name: "a/snapshot.json", Linkname: "/etc/shadow"}),
		"a member twice":  craft(reg("a/snapshot.json"), reg("a/snapshot.json")),
		"no files":        craft(),
		"not an archive":  []byte(strings.Repeat("lazyfs\n", 200)),
		"a hard link":     craft(tar.Header{Typeflag: tar.TypeLink, Name: "a/pages-1.img", Linkname: "a/snapshot.json"}),
		"a device":        craft(tar.Header{Typeflag: tar.TypeChar, Name: "a/pages-1.img", Devmajor: 1, Devminor: 1}),
		"a fifo in a dir": craft(tar.Header{Typeflag: tar.TypeDir, Name: "a/"}, tar.Header{Typeflag: tar.TypeFifo, Name: "a/p"}),
	} {
		f, err := os.Open(write(t, b, 0o600))
		if err != nil {
			t.Fatal(err)
		}
		if st, err := Open(f); !errors.Is(err, image.ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
			if st != nil {
				st.Close()
			}
			continue
		}
		f.Close()
	}
	if _, err := image.OpenWith(write(t, good, 0o666), image.OpenOptions{}); !errors.Is(err, image.ErrUntrusted) {
		t.Errorf("an archive others can write: %v, want ErrUntrusted", err)
	}
	// A FIFO where an archive is expected: refused at once, not waited on.
	fifo := filepath.Join(t.TempDir(), "fifo.tar")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := image.OpenWith(fifo, image.OpenOptions{}); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "neither a directory nor a snapshot archive") {
			t.Errorf("a FIFO: %v, want a refusal", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("opening a FIFO as a snapshot waits for a writer")
	}
	if snap, err := image.OpenWith(write(t, good, 0o666), image.OpenOptions{Trust: true}); err != nil {
		t.Errorf("an archive others can write, trusted: %v", err)
	} else {
		snap.Close()
	}

	// A byte of a block flipped: found when the block is read.
	f, err := os.Open(write(t, good, 0o600))
	if err != nil {
		t.Fatal(err)
	}
	st, err := Open(f)
	if err != nil {
		t.Fatal(err)
	}
	m := st.(*archiveStore).files["pages-4242.img"]
	st.Close()
	bad := bytes.Clone(good)
	bad[m.off+m.size/2] ^= 0x40
	snap, err := image.OpenWith(write(t, bad, 0o600), image.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	r, err := snap.OpenPages(pid, image.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Verify(context.Background(), nil); !errors.Is(err, image.ErrCorrupt) {
		t.Errorf("a block flipped in the archive: verify %v, want ErrCorrupt", err)
	}
}
