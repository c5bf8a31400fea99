package fds

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
)

// FileIdentity is the identity of the file at path that the snapshot
// records, from what /proc said of it.
func FileIdentity(path string, id proc.FileID) image.FileID {
	return image.FileID{Path: path, Dev: id.Dev, Ino: id.Ino, Size: id.Size, MtimeNs: id.Mtime.UnixNano(), Mode: id.Mode}
}

// dumpFile records a regular file, directory, character device or FIFO
// by path, offset and identity.
func dumpFile(f *proc.FD, out image.FD) (image.FD, error) {
	if f.Deleted {
		return out, fmt.Errorf("%w: open file %s was deleted", image.ErrUnsupported, f.Path)
	}
	out.Kind = map[proc.FDKind]string{proc.FDFile: image.FDFile, proc.FDDir: image.FDDir, proc.FDCharDev: image.FDChr, proc.FDFIFO: image.FDFifo}[f.Kind]
	out.Path = f.Path
	out.Pos = f.Info.Pos
	id := FileIdentity(f.Path, f.Stat)
	out.File = &id
	if f.Kind == proc.FDCharDev {
		out.Rdev = f.Stat.Rdev
	}
	return out, nil
}

// memfd records a memfd, whose contents are dumped with the memory that
// maps it: one that is not mapped is refused.
func (fx *fdDumper) memfd(f *proc.FD, out image.FD) (image.FD, error) {
	out.Kind = image.FDMemfd
	out.Path = f.Path
	out.Pos = f.Info.Pos
	id := FileIdentity(f.Path, f.Stat)
	out.File = &id
	if !fx.mapped(f.Stat.Ino) {
		return out, fmt.Errorf("%w: memfd %s is not mapped, so its contents are not dumped", image.ErrUnsupported, f.Path)
	}
	return out, nil
}

// fifo opens a named FIFO without blocking: a read end opens with
// O_NONBLOCK, a write end once a read end exists (held for the open).
func (fc *fdCreator) fifo(f *image.FD, cloexec int) (int, error) {
	acc := f.Flags & unix.O_ACCMODE
	flags := f.Flags &^ (unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC)
	holder := -1
	if acc == unix.O_WRONLY {
		var err error
		if holder, err = fc.open(f, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
			return -1, err
		}
		defer fc.closeFD(holder)
	}
	fd, err := fc.open(f, flags|unix.O_NONBLOCK|cloexec)
	if err != nil {
		return -1, err
	}
	if f.Flags&unix.O_NONBLOCK == 0 {
		if _, err := fc.in.Call(unix.SYS_FCNTL, uint64(fd), unix.F_SETFL, uint64(flags&^unix.O_NONBLOCK)); err != nil {
			return -1, err
		}
	}
	return fd, nil
}

// file opens a regular file, directory or character device at its
// offset.
func (fc *fdCreator) file(f *image.FD, cloexec uint64) (int, error) {
	if f.Ghost != nil {
		return fc.ghost(f, int(cloexec))
	}
	fd, err := fc.open(f, f.Flags&^(unix.O_CREAT|unix.O_EXCL|unix.O_TRUNC|unix.O_NOCTTY)|unix.O_NOCTTY|int(cloexec))
	if err != nil {
		return -1, err
	}
	if f.Pos != 0 && f.Flags&unix.O_APPEND == 0 {
		if _, err := fc.in.Call(unix.SYS_LSEEK, uint64(fd), uint64(f.Pos), unix.SEEK_SET); err != nil {
			return -1, fmt.Errorf("lseek %s to %d: %w", f.Path, f.Pos, err)
		}
	}
	return fd, nil
}

// memfd opens the memfd that mapping memory restored (a memfd is dumped
// only when mapped), at its offset.
func (fc *fdCreator) memfd(f *image.FD) (int, error) {
	if f.File == nil {
		return -1, fmt.Errorf("%w: memfd without identity", image.ErrCorrupt)
	}
	obj, ok := fc.shmem[f.File.Ino]
	if !ok {
		return -1, fmt.Errorf("%w: memfd %s maps no restored object", image.ErrCorrupt, f.Path)
	}
	dup := uint64(unix.F_DUPFD)
	if f.CloExec {
		dup = unix.F_DUPFD_CLOEXEC
	}
	fd, err := fc.in.Call(unix.SYS_FCNTL, uint64(obj), dup, 0)
	if err != nil {
		return -1, err
	}
	if f.Pos != 0 {
		if _, err := fc.in.Call(unix.SYS_LSEEK, fd, uint64(f.Pos), unix.SEEK_SET); err != nil {
			return -1, err
		}
	}
	return int(fd), nil
}

// open opens the file of f in the process with flags, and checks it is
// the one dumped: the same inode, or for a device the same device number.
func (fc *fdCreator) open(f *image.FD, flags int) (int, error) {
	if f.Kind != image.FDChr {
		if f.File == nil {
			return -1, fmt.Errorf("%w: %s without file identity", image.ErrCorrupt, f.Kind)
		}
		return OpenVerified(fc.in, f.Path, flags, *f.File, Match{Foreign: fc.opts.Foreign})
	}
	fd, err := fc.in.OpenAt2(f.Path, flags, 0, resolveNoLinks)
	if err != nil {
		return -1, err
	}
	st, err := fc.in.Fstat(fd)
	if err == nil && (st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != f.Rdev) {
		err = fmt.Errorf("%w: %s is now another device (mode %o rdev %#x, dumped rdev %#x)", ErrFileChanged, f.Path, st.Mode, st.Rdev, f.Rdev)
	}
	if err != nil {
		fc.closeFD(fd)
		return -1, err
	}
	return fd, nil
}

// statelessDevices are the character devices other than terminals that a
// reopen restores whole, all of major 1: /dev/null, zero, full, random
// and urandom. (/dev/kmsg, 1:11, keeps a read position per open file: a
// reopen would replay the log; /dev/mem and /dev/port, positions in
// memory.)
var statelessDevices = map[uint64]bool{
	unix.Mkdev(1, 3): true, unix.Mkdev(1, 5): true, unix.Mkdev(1, 7): true, unix.Mkdev(1, 8): true, unix.Mkdev(1, 9): true,
}
