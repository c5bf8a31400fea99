package fds

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
)

// A restore runs as root and acts on paths that the snapshot recorded.
// Between the dump and the restore, anyone who can write a directory on
// such a path can plant a symbolic link or another file there. So no path
// is opened by name and trusted: files are opened with no symbolic link
// in the path (openat2 RESOLVE_NO_SYMLINKS; the paths a dump records are
// the kernel's, which have none) and the file opened is compared with the
// one dumped; a unix socket's stale file is removed only through a
// directory whose whole path nobody but root and the process's own user
// can change, and only if it is a socket (engine/fds/sock).

// resolveNoLinks is the openat2 resolve mask for every path a restore
// opens: no symbolic link (magic links of /proc included) on the way.
const resolveNoLinks = unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// Match says how a file opened at restore must match its dumped identity.
type Match struct {
	// Bytes: the same bytes (a mapped file, an executable), its size and
	// modification time too; else it may have grown since, like a log.
	Bytes bool
	// Foreign: the file is in a container's root (restore --into), which
	// may be made anew (a copied directory, an overlay mount, another
	// host): its device and inode are that root's, not the dumped ones.
	// The file must then match by what the root keeps of it: its size
	// and modification time (for Bytes), or be there at all.
	Foreign bool
}

// OpenVerified opens path in the process in opens files in, with flags,
// refusing a symbolic link anywhere in the path, and checks that the file
// opened is the one dumped (id), as m says. On a mismatch the descriptor
// is closed and the error wraps ErrFileChanged.
func OpenVerified(in Opener, path string, flags int, id image.FileID, m Match) (int, error) {
	fd, err := in.OpenAt2(path, flags, 0, resolveNoLinks)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			return -1, fmt.Errorf("%w: %s: a symbolic link is now on its path (%w)", ErrFileChanged, path, err)
		}
		return -1, err
	}
	st, err := in.Fstat(fd)
	if err == nil {
		err = isDumped(path, st, id, m)
	}
	if err != nil {
		in.CloseFD(fd)
		return -1, err
	}
	return fd, nil
}

// Verified is one file of OpenVerifiedAll: OpenVerified's arguments.
type Verified struct {
	Path  string
	Flags int
	ID    image.FileID
	Match Match
}

// OpenVerifiedAll is OpenVerified of many files, opened and checked in a
// few resumes of the thread (ptrace.Injector.OpenAt2All). It returns
// their descriptors in the process, in order; on error, the first file's
// that failed, it closes every one it opened.
func OpenVerifiedAll(in *syscalls.Injector, files []Verified) ([]int, error) {
	reqs := make([]syscalls.OpenReq, len(files))
	for i, f := range files {
		reqs[i] = syscalls.OpenReq{Path: f.Path, Flags: f.Flags, Resolve: resolveNoLinks}
	}
	fds, sts, errs, err := in.OpenAt2All(reqs)
	if err == nil {
		for i, f := range files {
			if err = errs[i]; err != nil {
				if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
					err = fmt.Errorf("%w: %s: a symbolic link is now on its path (%w)", ErrFileChanged, f.Path, err)
				}
				break
			}
			if err = isDumped(f.Path, sts[i], f.ID, f.Match); err != nil {
				break
			}
		}
	}
	if err != nil {
		for _, fd := range fds {
			if fd >= 0 {
				in.CloseFD(fd)
			}
		}
		return nil, err
	}
	return fds, nil
}

// isDumped compares what fstat says of an opened file with the dumped
// identity, as m says.
func isDumped(path string, st unix.Stat_t, id image.FileID, m Match) error {
	if !m.Foreign && (st.Dev != id.Dev || st.Ino != id.Ino) {
		return fmt.Errorf("%w: %s is now another file (device %d inode %d, dumped device %d inode %d)", ErrFileChanged, path, st.Dev, st.Ino, id.Dev, id.Ino)
	}
	if m.Bytes && (st.Size != id.Size || st.Mtim.Nano() != id.MtimeNs) {
		return fmt.Errorf("%w: %s changed (size %d mtime %d, dumped size %d mtime %d)", ErrFileChanged, path, st.Size, st.Mtim.Nano(), id.Size, id.MtimeNs)
	}
	return nil
}
