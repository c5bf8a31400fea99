package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// dirStore is a snapshot directory, opened once: every file is opened
// through it, never following a link, so that nothing done to the path
// afterwards changes what is read.
type dirStore struct {
	d     *os.File
	trust bool
}

func (s *dirStore) String() string { return s.d.Name() }
func (s *dirStore) Close() error   { return s.d.Close() }

func (s *dirStore) Open(name string) (File, error) { return OpenAt(s.d, name) }

// LocalDir returns the directory itself: the working sets of lazy
// restores are kept beside the snapshot's files. The store closes it.
func (s *dirStore) LocalDir() (*os.File, error) { return s.d, nil }

// Stat checks a file of the directory: a regular file, not a link, and
// (unless trusted) one that only the caller and root can change.
func (s *dirStore) Stat(name string) (int64, error) {
	path := filepath.Join(s.d.Name(), name)
	var st unix.Stat_t
	if err := unix.Fstatat(int(s.d.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return 0, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0, fmt.Errorf("%s: %w: not a regular file (mode %o)", path, ErrCorrupt, st.Mode)
	}
	if !s.trust {
		if err := TrustedStat(&st, path); err != nil {
			return 0, err
		}
	}
	return st.Size, nil
}

// OpenDir opens a snapshot directory (following a link the caller named
// as the directory itself).
func OpenDir(dir string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return os.NewFile(uintptr(fd), dir), nil
}

// OpenAt opens the file name of the directory d for reading, refusing a
// link.
func OpenAt(d *os.File, name string) (*os.File, error) {
	fd, err := unix.Openat(int(d.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			err = fmt.Errorf("%w: a symbolic link", ErrCorrupt)
		}
		return nil, &os.PathError{Op: "open", Path: filepath.Join(d.Name(), name), Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(d.Name(), name)), nil
}

// Trusted checks that the open file f (what names it) is one that only
// the caller and root can change.
func Trusted(f *os.File, what string) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return err
	}
	return TrustedStat(&st, what)
}

// TrustedStat checks a file's owner and mode: owned by the caller or
// root, writable by neither group nor others (OpenSSH's StrictModes).
func TrustedStat(st *unix.Stat_t, what string) error {
	if euid := uint32(os.Geteuid()); st.Uid != 0 && st.Uid != euid {
		return fmt.Errorf("%w: %s belongs to uid %d, neither the caller (uid %d) nor root (--trust-snapshot accepts it)", ErrUntrusted, what, st.Uid, euid)
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("%w: %s is writable by group or others (mode %04o; --trust-snapshot accepts it)", ErrUntrusted, what, st.Mode&0o7777)
	}
	return nil
}
