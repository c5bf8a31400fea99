package fds

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds/broker"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
	"github.com/lazyfs/lazyfs/engine/units"
)

// Ghost files: a regular file deleted while the process holds it open (a
// log rotated away, a temporary file unlinked once opened, as databases
// and servers make them) is kept in the snapshot, contents, owner and
// mode, up to a size (dump --ghost-limit, 1 MiB by default as CRIU's),
// and restore makes a new file of them, never linked, in the directory
// the old one was in (O_TMPFILE). A larger one is refused at dump, naming
// it and the flag; so is one also mapped shared (its pages are the
// mapping's), and a deleted directory or FIFO.

// DefaultGhostLimit is the largest deleted file a dump keeps by default;
// MaxGhostLimit the largest one it can keep (the contents go in the
// process's state, which a snapshot bounds).
const (
	DefaultGhostLimit = 1 << 20
	MaxGhostLimit     = 64 << 20
)

// ghost records f, a deleted regular file, with its contents.
func (fx *fdDumper) ghost(f *proc.FD, out image.FD) (image.FD, error) {
	if fx.mapped(f.Stat.Ino) {
		return out, fmt.Errorf("%w: open file %s was deleted and is mapped shared: its pages are the mapping's", image.ErrUnsupported, f.Path)
	}
	out.Kind = image.FDFile
	out.Path = f.Path
	out.Pos = f.Info.Pos
	id := FileIdentity(f.Path, f.Stat)
	out.File = &id
	key := [2]uint64{f.Stat.Dev, f.Stat.Ino}
	if first, ok := fx.ghosts[key]; ok {
		out.Ghost = &image.Ghost{Mode: f.Stat.Mode & 0o7777, Of: &first}
		return out, nil
	}
	// Its contents, read through the process's descriptor (the file has
	// no other name), as a new open file description of our own.
	g, err := ReadGhost(fmt.Sprintf("/proc/%d/fd/%d", fx.pid, f.Num), "open file "+f.Path, f.Stat.Ino, fx.ghostLimit)
	if err != nil {
		return out, err
	}
	if fx.ghosts == nil {
		fx.ghosts = map[[2]uint64]int{}
	}
	fx.ghosts[key] = f.Num
	out.Ghost = g
	fx.log.Info("deleted file kept", "pid", fx.pid, "fd", f.Num, "path", f.Path, "bytes", len(g.Data))
	return out, nil
}

// ghost makes the deleted file of f again and returns a descriptor on it
// in the process, opened with f's flags: the first descriptor of a file
// gets a new file, made by snapctl in the old file's directory with
// O_TMPFILE (never linked), filled, given its owner and mode, handed to
// the process and opened again there through /proc/self/fd with f's own
// flags; a later one (Ghost.Of) opens that descriptor's file again so.
func (fc *fdCreator) ghost(f *image.FD, cloexec int) (int, error) {
	g := f.Ghost
	flags := f.Flags&^(unix.O_CREAT|unix.O_EXCL|unix.O_TRUNC) | unix.O_NOCTTY | cloexec
	if g.Of != nil {
		return fc.reopen(*g.Of, flags, f)
	}
	pfd, err := fc.Pidfd()
	if err != nil {
		return -1, err
	}
	held, err := makeGhost(fc.in, pfd, f.Path, g)
	if err != nil {
		return -1, err
	}
	defer fc.closeFD(held)
	return fc.reopen(held, flags, f)
}

// makeGhost makes deleted file g again: a file of its contents, owner and
// mode, made by snapctl in the directory of path with O_TMPFILE and
// O_EXCL (nothing can ever link it: a program made again from a setuid
// one must not become a setuid file anyone can reach), without its
// set-user-ID and set-group-ID bits, and handed to the process (pidfd) in
// injects into, where it returns its descriptor (read-write,
// close-on-exec).
func makeGhost(in injector, pidfd int, path string, g *image.Ghost) (int, error) {
	dir := filepath.Dir(path)
	tmp, err := unix.Open(dir, unix.O_TMPFILE|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return -1, fmt.Errorf("recreate deleted file %s: O_TMPFILE in %s: %w", path, dir, err)
	}
	defer unix.Close(tmp)
	if _, err := unix.Pwrite(tmp, g.Data, 0); err != nil {
		return -1, fmt.Errorf("recreate deleted file %s: %w", path, err)
	}
	if err := unix.Fchown(tmp, int(g.UID), int(g.GID)); err != nil {
		return -1, fmt.Errorf("recreate deleted file %s: chown: %w", path, err)
	}
	if err := unix.Fchmod(tmp, g.Mode&^(unix.S_ISUID|unix.S_ISGID)); err != nil {
		return -1, fmt.Errorf("recreate deleted file %s: chmod: %w", path, err)
	}
	held, err := broker.PassFD(in, pidfd, tmp, true)
	if err != nil {
		return -1, fmt.Errorf("recreate deleted file %s: %w", path, err)
	}
	return held, nil
}

// MakeGhost makes deleted file g of path again in the process in injects
// into (a mapped file's: see the ghost files above) and returns its
// descriptor there, read-only and close-on-exec: no descriptor open for
// writing is left on it, so that it can be the process's exe.
func MakeGhost(in *syscalls.Injector, path string, g *image.Ghost) (int, error) {
	pid := in.Thread().Process().Pid() // ours: not the dumped pid in a new pid namespace
	pfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(pfd)
	held, err := makeGhost(in, pfd, path, g)
	if err != nil {
		return -1, err
	}
	defer in.CloseFD(held)
	// /proc/self/fd/N is a magic link: no RESOLVE_NO_MAGICLINKS here.
	fd, err := in.OpenAt2(fmt.Sprintf("/proc/self/fd/%d", held), unix.O_RDONLY|unix.O_CLOEXEC, 0, 0)
	if err != nil {
		return -1, fmt.Errorf("open deleted file %s again: %w", path, err)
	}
	return fd, nil
}

// ReadGhost reads deleted file f (a path under /proc that reaches it:
// /proc/PID/fd/N, /proc/PID/map_files/A-B) of inode ino, with its owner
// and mode, if it is no larger than limit (0: the default; negative: none
// kept); path says what it was in errors ("open file /tmp/x").
func ReadGhost(f, path string, ino uint64, limit int64) (*image.Ghost, error) {
	if limit == 0 {
		limit = DefaultGhostLimit
	}
	if limit < 0 {
		return nil, fmt.Errorf("%w: %s was deleted, and --ghost-limit 0 keeps none", image.ErrUnsupported, path)
	}
	r, err := os.Open(f)
	if err != nil {
		return nil, fmt.Errorf("deleted file %s: %w", path, err)
	}
	defer r.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(r.Fd()), &st); err != nil {
		return nil, fmt.Errorf("deleted file %s: %w", path, err)
	}
	if st.Ino != ino {
		return nil, fmt.Errorf("deleted file %s changed while it was read", path)
	}
	if st.Size > limit {
		return nil, fmt.Errorf("%w: %s was deleted, and its %s are more than --ghost-limit %s: raise it to keep them in the snapshot",
			image.ErrUnsupported, path, units.FormatSize(uint64(st.Size)), units.FormatSize(uint64(limit)))
	}
	g := &image.Ghost{Mode: st.Mode & 0o7777, UID: st.Uid, GID: st.Gid}
	if g.Data, err = io.ReadAll(io.LimitReader(r, limit+1)); err != nil {
		return nil, fmt.Errorf("deleted file %s: %w", path, err)
	}
	if int64(len(g.Data)) > limit {
		return nil, fmt.Errorf("deleted file %s grew past --ghost-limit while it was read", path)
	}
	return g, nil
}

// reopen opens, in the process, the file of its descriptor fd again with
// flags, at f's offset.
func (fc *fdCreator) reopen(fd, flags int, f *image.FD) (int, error) {
	// /proc/self/fd/N is a magic link: no RESOLVE_NO_MAGICLINKS here.
	nfd, err := fc.in.OpenAt2(fmt.Sprintf("/proc/self/fd/%d", fd), flags, 0, 0)
	if err != nil {
		return -1, fmt.Errorf("open deleted file %s again: %w", f.Path, err)
	}
	if f.Pos != 0 {
		if _, err := fc.in.Call(unix.SYS_LSEEK, uint64(nfd), uint64(f.Pos), unix.SEEK_SET); err != nil {
			fc.closeFD(nfd)
			return -1, fmt.Errorf("lseek deleted file %s: %w", f.Path, err)
		}
	}
	return nfd, nil
}
