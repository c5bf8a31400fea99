package workingset

import (
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

// Read reads the working set of process pid beside snapshot s. Absent,
// it returns an error matching os.ErrNotExist; recorded on another
// snapshot or process, ErrForeign; damaged, image.ErrCorrupt. Every
// error names the file. Without image.OpenOptions.Trust, a file that
// another user can change is refused (image.ErrUntrusted), as the
// snapshot's own are.
func Read(s *image.Snapshot, pid int) (*Set, error) {
	d, err := s.BesideDir(Name(pid))
	if err != nil {
		return nil, err
	}
	return readFile(d, pid, s.ID(), s.Options().Trust, false)
}

// Map is Read, the file mapped rather than read: its entries' Data are
// the page cache's pages, valid until Close. A restore that starts reads
// its working set so: tens of MiB read into memory a new process has
// never touched cost it a first touch of every page, slow where the
// hypervisor reclaims free memory, while the pages of a file read before
// are there to map. Map checks the header and the entries, not their
// bytes: Set.CheckData checks an entry's, and whoever uses them calls it
// first. (Checking every entry at once, with the mapping's page tables
// filled first, held a restore's pager back until all was checked,
// where it needs the first entries first.) Whoever reads Data must
// expect the file to shrink under it (another writer truncating it in
// place, which snapctl never does: it renames a new file over the old):
// a read past its end faults, and ReadData and CheckData turn that into
// an error.
func Map(s *image.Snapshot, pid int) (*Set, error) {
	d, err := s.BesideDir(Name(pid))
	if err != nil {
		return nil, err
	}
	return readFile(d, pid, s.ID(), s.Options().Trust, true)
}

// Dir returns the directory where the working sets of snapshot s are
// read and written, or an error matching image.ErrUnsupported that says
// why it has none.
func Dir(s *image.Snapshot) (string, error) {
	d, err := s.LocalDir()
	if err != nil {
		return "", err
	}
	return d.Name(), nil
}

// ReadDir reads the working set of process pid in the snapshot
// directory dir, checking it against the snapshot's identity id (taken
// when the snapshot was opened: image.Snapshot.ID), with the checks of
// Read. For a reader that keeps no snapshot open (a mount).
func ReadDir(dir string, pid int, id image.SnapshotID, trust bool) (*Set, error) {
	d, err := image.OpenDir(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return readFile(d, pid, id, trust, false)
}

func readFile(d *os.File, pid int, id image.SnapshotID, trust, mapped bool) (*Set, error) {
	name := Name(pid)
	path := filepath.Join(d.Name(), name)
	f, err := image.OpenBeside(d, name, trust)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > wsHeaderSize+wsEntrySize*maxWSEntries+MaxData {
		return nil, fmt.Errorf("%s: %w: %d bytes", path, image.ErrCorrupt, st.Size())
	}
	var b []byte
	unmap := func() error { return nil }
	if mapped && st.Size() > 0 {
		if b, err = unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED); err != nil {
			return nil, fmt.Errorf("map %s: %w", path, err)
		}
		unmap = func() error { return unix.Munmap(b) }
	} else {
		b = make([]byte, st.Size())
		if _, err := io.ReadFull(f, b); err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
	}
	// A mapped file's entries' bytes are checked when used (Map).
	w, err := parseMapped(b, !mapped)
	if err == nil {
		err = check(w, pid, id)
	}
	if err != nil {
		unmap()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if mapped {
		w.unmap = unmap
	}
	return w, nil
}

// check checks that w was recorded on process pid of the
// snapshot id.
func check(w *Set, pid int, id image.SnapshotID) error {
	if w.Snapshot != id {
		return fmt.Errorf("%w: recorded on snapshot %v, this one is %v", ErrForeign, w.Snapshot, id)
	}
	if w.PID != pid {
		return fmt.Errorf("%w: recorded for process %d, not %d", ErrForeign, w.PID, pid)
	}
	return nil
}

// Write writes w beside snapshot s, through its directory (never
// following a link), atomically: a temporary file of a new name, synced,
// checked by reading it back, then renamed over the old one. A writer
// killed at any point leaves the old file (or none) and at most a
// temporary file, never a partial working set. The file is mode 0600,
// like the snapshot's: it holds process memory.
func Write(s *image.Snapshot, w *Set) error {
	d, err := s.LocalDir()
	if err != nil {
		return err
	}
	return writeFile(d, w)
}

// WriteDir writes w into the snapshot directory dir, as Write does.
func WriteDir(dir string, w *Set) error {
	d, err := image.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("write working set: %w", err)
	}
	defer d.Close()
	return writeFile(d, w)
}

func writeFile(d *os.File, w *Set) error {
	b, err := w.MarshalBinary()
	if err != nil {
		return err
	}
	name := Name(w.PID)
	path := filepath.Join(d.Name(), name)
	dfd := int(d.Fd())
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("write working set %s: %w", path, err)
	}
	tmp := fmt.Sprintf(".%s.%x.tmp", name, rnd)
	fd, err := unix.Openat(dfd, tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("write working set %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(d.Name(), tmp))
	err = func() error {
		if _, err := f.Write(b); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		back := make([]byte, len(b)+1)
		n, err := f.ReadAt(back, 0)
		if err != nil && err != io.EOF {
			return err
		}
		if _, err := Parse(back[:n]); err != nil {
			return fmt.Errorf("reading it back: %w", err)
		}
		return nil
	}()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, name)
	}
	if err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("write working set %s: %w", path, err)
	}
	if err := unix.Fsync(dfd); err != nil {
		return fmt.Errorf("write working set %s: sync the directory: %w", path, err)
	}
	return nil
}
