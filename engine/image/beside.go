package image

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

// Files beside a snapshot, outside its manifest (a working set, package
// workingset): a snapshot is complete and verifiable with or without
// them. They are kept in the snapshot's directory, or its store's local
// directory, and opened as the snapshot's own files are.

// SnapshotID identifies a snapshot: the checksum and length of its
// manifest, which names every file of it with their checksums.
type SnapshotID struct {
	CRC32C uint32
	Size   uint32
}

func (id SnapshotID) String() string { return fmt.Sprintf("%08x/%d", id.CRC32C, id.Size) }

// ID returns the snapshot's identity.
func (s *Snapshot) ID() SnapshotID { return IDOf(s.manifest) }

// IDOf returns the identity of the snapshot whose snapshot.json is
// manifest.
func IDOf(manifest []byte) SnapshotID {
	return SnapshotID{CRC32C: codec.Checksum(manifest), Size: uint32(len(manifest))}
}

// LocalDirStore is a store.Store that keeps the files written beside a
// snapshot after its dump (working sets) in a local directory of its own:
// a snapshot directory is its own, an object store's is in its cache
// directory.
type LocalDirStore interface {
	store.Store
	// LocalDir returns that directory, the Store's to close; an error
	// matching ErrUnsupported if the store has none.
	LocalDir() (*os.File, error)
}

// LocalDir returns the directory where the files beside the snapshot
// are: the snapshot's own directory, or its store's local directory
// (LocalDirStore); ErrUnsupported for a store that has none. It is the
// snapshot's (or its store's) to close.
func (s *Snapshot) LocalDir() (*os.File, error) {
	if st, ok := s.store.(LocalDirStore); ok {
		return st.LocalDir()
	}
	return nil, fmt.Errorf("%s: %w: working sets are kept beside snapshots in directories only", s.Dir, ErrUnsupported)
}

// BesideDir is LocalDir for reading the file name beside the snapshot: a
// store without a local directory that holds no such file (an archive
// without one) says it does not exist, not that it is unsupported.
func (s *Snapshot) BesideDir(name string) (*os.File, error) {
	d, err := s.LocalDir()
	if errors.Is(err, ErrUnsupported) && !store.IsRemote(s.Dir) {
		if _, serr := s.store.Stat(name); errors.Is(serr, os.ErrNotExist) {
			return nil, serr
		}
	}
	return d, err
}

// OpenDir opens the snapshot directory dir (following a link the caller
// named as the directory itself), for OpenBeside.
func OpenDir(dir string) (*os.File, error) { return store.OpenDir(dir) }

// OpenBeside opens the file name of directory d (LocalDir, BesideDir,
// OpenDir) for reading as a snapshot's own file is opened: never through
// a link, a regular file (ErrCorrupt otherwise) and, unless trust, one
// that only the caller and root can change (ErrUntrusted).
func OpenBeside(d *os.File, name string, trust bool) (*os.File, error) {
	path := filepath.Join(d.Name(), name)
	f, err := store.OpenAt(d, name)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = fmt.Errorf("%s: %w: not a regular file", path, ErrCorrupt)
	}
	if err == nil && !trust {
		err = store.Trusted(f, path)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
