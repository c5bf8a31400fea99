package s3

import (
	"fmt"
	"os"

	"github.com/lazyfs/lazyfs/engine/image"
)

// LocalDir returns the local directory of files kept beside the snapshot
// (image.LocalDirStore): the working sets that lazy restores record,
// which the store itself does not hold. It is a directory of the cache
// directory (--cache-dir) named by the snapshot's address, made on first
// use, and held to the cache directory's rules (cache.Dir.SideDir).
// Without a cache directory there is none (image.ErrUnsupported, naming
// the flag). The Store closes it.
func (s *Store) LocalDir() (*os.File, error) {
	s.sideOnce.Do(func() { s.side, s.sideErr = s.openLocalDir() })
	return s.side, s.sideErr
}

func (s *Store) openLocalDir() (*os.File, error) {
	if s.disk == nil {
		return nil, fmt.Errorf("%s: %w: working sets of a snapshot in an object store are kept in its cache directory: give --cache-dir", s.String(), image.ErrUnsupported)
	}
	return s.disk.SideDir(s.c.snapshotID())
}
