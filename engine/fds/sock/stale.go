package sock

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

// A restore runs as root and binds unix sockets at paths that the
// snapshot recorded. Between the dump and the restore, anyone who can
// write a directory on such a path can plant a symbolic link or another
// file there: a socket's stale file is removed only through a directory
// whose whole path nobody but root and the process's own user can
// change, and only if it is a socket.

// ErrUntrustedPath: a path the restore would create or remove a file on
// passes through a symbolic link or a directory that a user other than
// root and the restored process's own can change.
// It matches image.ErrUntrusted.
var ErrUntrustedPath = image.Untrusted("untrusted path")

// resolveNoLinks is the openat2 resolve mask of every path opened here:
// no symbolic link (magic links of /proc included) on the way.
const resolveNoLinks = unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// removeStaleSocket removes the file at path, absolute, that a unix
// socket of type typ about to be bound there again left behind, as a
// server starting up would. Its directory is opened component by
// component, refusing a symbolic link or a directory that a user other
// than root and uid may change (StrictModes); the file is removed through
// that directory, only if it is a socket, and only if nobody listens on
// it (a live socket of another program is never taken: EADDRINUSE).
func removeStaleSocket(path string, typ int, uid uint32) error {
	dir, name := filepath.Split(path)
	dfd, err := trustedDir(dir, uid)
	if err != nil {
		return fmt.Errorf("unix socket %s: %w", path, err)
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("unix socket %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("%w: unix socket %s: a file that is not a socket is there now; not removing it", ErrUntrustedPath, path)
	}
	if live(dfd, name, typ) {
		return fmt.Errorf("unix socket %s: %w: another program listens on it now", path, unix.EADDRINUSE)
	}
	if err := unix.Unlinkat(dfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unix socket %s: remove the stale socket: %w", path, err)
	}
	return nil
}

// live reports whether a socket of type typ at name in the directory
// dfd accepts a connection: a stale file refuses it (ECONNREFUSED).
func live(dfd int, name string, typ int) bool {
	s, err := unix.Socket(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer unix.Close(s)
	// Connect through /proc/self/fd/DFD/NAME: the directory already
	// opened, not the path again.
	addr := fmt.Sprintf("/proc/self/fd/%d/%s", dfd, name)
	if len(addr) >= 108 {
		return false // cannot say: the file is removed as before
	}
	err = unix.Connect(s, &unix.SockaddrUnix{Name: addr})
	return err == nil || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINPROGRESS)
}

// trustedDir opens the absolute directory dir (O_PATH) one component at
// a time, each without following a symbolic link, and checks that every
// directory from / down is owned by root or uid and writable by nobody
// else (group or others may write a sticky directory, like /tmp: they
// cannot rename or remove what they do not own).
func trustedDir(dir string, uid uint32) (int, error) {
	if !filepath.IsAbs(dir) {
		return -1, fmt.Errorf("%w: %s is not absolute", ErrUntrustedPath, dir)
	}
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	at := "/"
	for _, c := range append([]string{""}, strings.Split(strings.Trim(filepath.Clean(dir), "/"), "/")...) {
		if c != "" {
			next, err := unix.Openat2(fd, c, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveNoLinks})
			unix.Close(fd)
			at = filepath.Join(at, c)
			if err != nil {
				if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
					return -1, fmt.Errorf("%w: %s is a symbolic link or not a directory", ErrUntrustedPath, at)
				}
				return -1, fmt.Errorf("open %s: %w", at, err)
			}
			fd = next
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return -1, err
		}
		if st.Uid != 0 && st.Uid != uid {
			unix.Close(fd)
			return -1, fmt.Errorf("%w: directory %s belongs to uid %d, neither root nor the process's uid %d", ErrUntrustedPath, at, st.Uid, uid)
		}
		if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
			unix.Close(fd)
			return -1, fmt.Errorf("%w: directory %s is writable by group or others (mode %04o) and not sticky", ErrUntrustedPath, at, st.Mode&0o7777)
		}
	}
	return fd, nil
}
