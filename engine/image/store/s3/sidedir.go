package s3

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

// LocalDir returns the local directory of files kept beside the snapshot
// (image.LocalDirStore): the working sets that lazy restores record,
// which the store itself does not hold. It is a directory of the cache
// directory (--cache-dir) named by the snapshot's address, made on first
// use, and held to the cache directory's rules: opened beneath it, never
// through a symbolic link, the caller's or root's and writable by nobody
// else (unless --trust-snapshot). Without a cache directory there is none
// (image.ErrUnsupported, naming the flag). The Store closes it.
func (s *Store) LocalDir() (*os.File, error) {
	s.sideOnce.Do(func() { s.side, s.sideErr = s.openLocalDir() })
	return s.side, s.sideErr
}

func (s *Store) openLocalDir() (*os.File, error) {
	if s.disk == nil {
		return nil, fmt.Errorf("%s: %w: working sets of a snapshot in an object store are kept in its cache directory: give --cache-dir", s.String(), image.ErrUnsupported)
	}
	c := s.disk
	if !c.hold() {
		return nil, errors.New("cache directory closed")
	}
	defer c.release()
	h := sha256.Sum256(fmt.Appendf(nil, "side\x00%s\x00%s\x00%s", s.c.endpoint, s.c.addr.Bucket, s.c.addr.listPrefix()))
	name := "snapshot-" + hex.EncodeToString(h[:16])
	if err := unix.Mkdirat(c.fd(), name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("cache directory %s: %w", c.name, &os.PathError{Op: "mkdir", Path: name, Err: err})
	}
	fd, err := unix.Openat(c.fd(), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("cache directory %s: %w", c.name, &os.PathError{Op: "open", Path: name, Err: err})
	}
	d := os.NewFile(uintptr(fd), c.name+"/"+name)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		d.Close()
		return nil, fmt.Errorf("%s: %w", d.Name(), err)
	}
	if !c.trust {
		if euid := uint32(os.Geteuid()); st.Uid != 0 && st.Uid != euid {
			d.Close()
			return nil, fmt.Errorf("%w: %s belongs to uid %d, neither the caller (uid %d) nor root", image.ErrUntrusted, d.Name(), st.Uid, euid)
		}
		if st.Mode&0o022 != 0 {
			d.Close()
			return nil, fmt.Errorf("%w: %s is writable by group or others (mode %04o)", image.ErrUntrusted, d.Name(), st.Mode&0o7777)
		}
	}
	return d, nil
}
