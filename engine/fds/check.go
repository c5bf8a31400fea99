package fds

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
)

// ErrFileChanged: a file the process mapped or opened is not the one it
// was at the dump.
var ErrFileChanged = errors.New("file changed since the dump")

// StatIn returns the identity of path as a process whose root directory
// is root sees it (root "" is ours; "/proc/PID/root" a container's): the
// path resolved inside root (RESOLVE_IN_ROOT), absolute symbolic links
// included, never outside it.
func StatIn(root, path string) (proc.FileID, error) {
	if root == "" {
		return proc.StatFile(path)
	}
	d, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return proc.FileID{}, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(d)
	fd, err := unix.Openat2(d, path, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return proc.FileID{}, &os.PathError{Op: "stat", Path: path + " (in " + root + ")", Err: err}
	}
	defer unix.Close(fd)
	return proc.StatFile(fmt.Sprintf("/proc/self/fd/%d", fd))
}

// CheckFile refuses a file whose identity (device, inode, size, mtime)
// differs from the dumped one, its path resolved in root (StatIn); in a
// container's root (root not ""), which may be made anew, by its size and
// mtime only (Match.Foreign). what names it in the error ("executable",
// "mapping 7f..-7f..").
func CheckFile(root string, id image.FileID, what string) error {
	cur, err := StatIn(root, id.Path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %s %s is not there any more (%v)", ErrFileChanged, what, id.Path, err)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, id.Path, err)
	}
	if (root == "" && (cur.Dev != id.Dev || cur.Ino != id.Ino)) || cur.Size != id.Size || cur.Mtime.UnixNano() != id.MtimeNs {
		return fmt.Errorf("%w: %s %s: now device %d inode %d size %d mtime %d; dumped device %d inode %d size %d mtime %d",
			ErrFileChanged, what, id.Path, cur.Dev, cur.Ino, cur.Size, cur.Mtime.UnixNano(), id.Dev, id.Ino, id.Size, id.MtimeNs)
	}
	return nil
}

// CheckRestorable refuses, before the restore creates anything, a
// descriptor this build cannot restore or whose file is not the one
// dumped, its path resolved in root (StatIn).
func CheckRestorable(root string, f image.FD) error {
	if f.Tree != nil && f.Tree.PID != 0 {
		return nil // another process's, checked there
	}
	if f.External != "" {
		return nil // given by the caller, or /dev/null (CheckExternal)
	}
	if f.Ghost != nil || f.Pty != nil {
		return nil // made anew from the snapshot
	}
	switch f.Kind {
	case image.FDFile, image.FDDir, image.FDFifo:
		if f.File == nil {
			return fmt.Errorf("%w: %s without file identity", image.ErrCorrupt, f.Kind)
		}
		cur, err := StatIn(root, f.Path)
		if err != nil {
			return fmt.Errorf("%s: %w", f.Path, err)
		}
		// An open file may have grown since (a log): identity is the
		// inode, and the offset must still be inside it.
		if root == "" && (cur.Dev != f.File.Dev || cur.Ino != f.File.Ino) {
			return fmt.Errorf("%w: %s is now another file (inode %d, was %d)", ErrFileChanged, f.Path, cur.Ino, f.File.Ino)
		}
		if f.Kind == image.FDFile && f.Flags&unix.O_APPEND == 0 && f.Pos > cur.Size {
			return fmt.Errorf("%w: %s is %d bytes, shorter than the saved offset %d", ErrFileChanged, f.Path, cur.Size, f.Pos)
		}
	case image.FDChr:
		if _, err := StatIn(root, f.Path); err != nil {
			return err
		}
	case image.FDMemfd, image.FDPipe, image.FDEventfd, image.FDEpoll, image.FDSocket, image.FDTimerfd, image.FDSignalfd:
	default:
		return fmt.Errorf("%w: this build cannot restore %s descriptors", image.ErrUnsupported, f.Kind)
	}
	return nil
}
