package fds

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds/broker"
	"github.com/lazyfs/lazyfs/engine/fds/sock"
	"github.com/lazyfs/lazyfs/engine/fds/tty"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
)

// Descriptors of a process tree. Three things link the processes of a
// tree through their descriptors:
//
//   - an open file description inherited across fork (one offset, one set
//     of flags): the first process holding it (in the order of the tree)
//     describes it; the others name that process's descriptor
//     (image.FDTree.PID and FD), and restore hands them the very
//     description (pidfd_getfd), whatever its kind;
//   - a pipe whose ends are in different processes (sh -c 'a | b'): each
//     end is described where it is, marked shared, and the bytes in flight
//     are stored once, with a read end; restore makes the pipe once, in
//     snapctl, and hands each process its ends;
//   - a unix socket pair whose ends are in different processes (nginx's
//     master and workers): the same, each end with the data queued to it.
//
// The same open file description always has the same inode and the same
// open flags; kcmp(KCMP_FILE) tells whether two such are one.

// Tree hands out the objects that the processes of a tree share, during
// the restore of the tree (a broker.Broker). Keys name the objects:
// broker.OFDKey, broker.PipeKey, broker.UnixKey, tty.PtyKey, ShmemKey.
type Tree interface {
	// Take puts into the process that in injects into a descriptor on
	// the object key and returns its number there (close-on-exec); ok
	// is false if no process has handed the object out yet.
	Take(in *syscalls.Injector, key string) (fd int, ok bool, err error)
	// Give hands out the object fd of process pid holds, as key.
	Give(pid int, key string, fd int) error
}

// ShmemKey names a shared memory object mapped by several processes.
func ShmemKey(id uint64) string { return fmt.Sprintf("shm:%d", id) }

// treeDumper is what the dump of one process of a tree knows of the
// others.
type treeDumper struct {
	pipes   map[uint64]*treePipe // pipes with ends in several processes
	sockets map[uint64]bool      // socket inodes held in the tree
	// from are the descriptors of the process being described that
	// share the open file description of one of a process before it.
	from map[int]*image.FDTree
}

// inherited returns what descriptor num of the process being described
// shares its open file description with, or nil.
func (td *treeDumper) inherited(num int) *image.FDTree {
	if td == nil {
		return nil
	}
	return td.from[num]
}

// inheritedFD describes f, which shares the open file description of r:
// its number and flags; the rest is r's. Its kind is set by DumpTree.
func inheritedFD(f *proc.FD, r *image.FDTree) image.FD {
	out := image.FD{FD: f.Num, Tree: r}
	if f.Info != nil {
		out.CloExec = f.Info.Flags&unix.O_CLOEXEC != 0
		out.Flags = int(f.Info.Flags) &^ unix.O_CLOEXEC
	}
	return out
}

// treePipe is a pipe whose ends are in several processes.
type treePipe struct {
	data struct{ pid, fd int } // the read end whose bytes are dumped
	read bool
}

// DumpTree describes the descriptors of every process of a frozen tree,
// pids in the order of the tree (a parent before its children), maps
// each one's mappings; it refuses the first descriptor the snapshot
// format cannot describe, naming the process and the descriptor. A pipe
// or unix socket leads outside when its other end is outside the tree:
// o.External is matched against those only, and each resource it names
// must match in some process. With o.TCP, the established connections of
// every process are locked with one nft batch before any is taken.
func DumpTree(pids []int, maps [][]proc.Mapping, o DumpOptions) ([][]image.FD, error) {
	all := make([][]proc.FD, len(pids))
	for i, pid := range pids {
		var err error
		if all[i], err = proc.ReadFDs(pid); err != nil {
			return nil, fmt.Errorf("pid %d: %w", pid, err)
		}
	}
	from := inheritedInTree(pids, all)
	pipes := pipesInTree(pids, all, from)
	sockets := map[uint64]bool{}
	for i := range all {
		for j := range all[i] {
			if f := &all[i][j]; f.Kind == proc.FDSocket {
				sockets[f.Ino] = true
			}
		}
	}
	used := map[string]bool{}
	ptys, err := tty.Masters(pids, all...)
	if err != nil {
		return nil, err
	}
	fxs := make([]*fdDumper, 0, len(pids))
	defer func() {
		for _, fx := range fxs {
			fx.close()
		}
	}()
	for i, pid := range pids {
		td := &treeDumper{pipes: pipes, sockets: sockets, from: from[i]}
		fx, err := newFDDumper(pid, maps[i], all[i], td, o, used)
		if err != nil {
			return nil, err
		}
		fx.tty.Pairs = ptys
		fxs = append(fxs, fx)
	}
	if o.TCP != nil {
		ds := make([]*sock.Dumper, len(fxs))
		for i, fx := range fxs {
			ds[i] = &fx.sock
		}
		if err := sock.LockConns(o.TCP, ds); err != nil {
			return nil, err
		}
	}
	out := make([][]image.FD, len(pids))
	for i, fx := range fxs {
		fds, err := fx.dump()
		if err != nil {
			return nil, err
		}
		markTreeLinks(fds, out, pids, all[i], pipes)
		out[i] = fds
	}
	if err := o.External.checkUsed(pids, used); err != nil {
		return nil, err
	}
	return out, nil
}

// pipesInTree finds the pipes whose own open file descriptions (not
// inherited ones, from) are in several processes, with a read end and a
// write end in the tree, and the read end whose bytes are dumped.
func pipesInTree(pids []int, all [][]proc.FD, from []map[int]*image.FDTree) map[uint64]*treePipe {
	pipes := map[uint64]*treePipe{}
	holders := map[uint64]map[int]bool{}
	for i := range pids {
		for j := range all[i] {
			f := &all[i][j]
			if f.Kind != proc.FDPipe || from[i][f.Num] != nil {
				continue
			}
			if holders[f.Ino] == nil {
				holders[f.Ino] = map[int]bool{}
			}
			holders[f.Ino][i] = true
			if len(holders[f.Ino]) > 1 {
				pipes[f.Ino] = &treePipe{}
			}
		}
	}
	writers := map[uint64]bool{}
	for i := range pids {
		for j := range all[i] {
			f := &all[i][j]
			p := pipes[f.Ino]
			if f.Kind != proc.FDPipe || p == nil || from[i][f.Num] != nil || f.Info == nil {
				continue
			}
			if f.Info.Flags&unix.O_ACCMODE == unix.O_RDONLY {
				if !p.read {
					p.read, p.data.pid, p.data.fd = true, pids[i], f.Num
				}
			} else {
				writers[f.Ino] = true
			}
		}
	}
	for ino, p := range pipes {
		if !p.read || !writers[ino] {
			// Its other end is outside the tree: each process's end is
			// refused or recorded as leading outside, as in a single
			// process.
			delete(pipes, ino)
		}
	}
	return pipes
}

// markTreeLinks marks the descriptors fds of one process (whose
// descriptors in /proc are mine) that link it to others of the tree: one
// inherited gets the kind of the descriptor it names (described before, in
// out), a pipe or socket pair end shared with another process is marked
// shared.
func markTreeLinks(fds []image.FD, out [][]image.FD, pids []int, mine []proc.FD, pipes map[uint64]*treePipe) {
	for k := range fds {
		f := &fds[k]
		if f.Tree != nil {
			f.Kind = kindOf(out, pids, f.Tree)
			continue
		}
		if f.Kind == image.FDPipe && pipes[f.Pipe.ID] != nil {
			f.Tree = &image.FDTree{Shared: true}
		}
		if s := f.Socket; s != nil && s.Family == unix.AF_UNIX && s.State == sock.StateConnected {
			if peer, ok := s.Options[sock.PeerInodeOption]; ok && !holds(mine, uint64(peer)) {
				f.Tree = &image.FDTree{Shared: true}
			}
		}
	}
}

// kindOf is the kind of the descriptor r names, described before.
func kindOf(out [][]image.FD, pids []int, r *image.FDTree) string {
	for i, pid := range pids {
		if pid != r.PID {
			continue
		}
		for _, f := range out[i] {
			if f.FD == r.FD {
				return f.Kind
			}
		}
	}
	return ""
}

func holds(fds []proc.FD, ino uint64) bool {
	for _, f := range fds {
		if f.Kind == proc.FDSocket && f.Ino == ino {
			return true
		}
	}
	return false
}

// inheritedInTree finds, for each process, the descriptors whose open
// file description a process before it in the tree holds already:
// process i, descriptor number -> that process and descriptor (its
// lowest one).
func inheritedInTree(pids []int, all [][]proc.FD) []map[int]*image.FDTree {
	type key struct {
		dev, ino uint64
		flags    uint32
	}
	type holder struct{ i, fd int }
	seen := map[key][]holder{}
	out := make([]map[int]*image.FDTree, len(pids))
	for i := range pids {
		out[i] = map[int]*image.FDTree{}
		var mine []func()
		for j := range all[i] {
			f := &all[i][j]
			if f.Info == nil {
				continue
			}
			k := key{f.Stat.Dev, f.Stat.Ino, f.Info.Flags &^ unix.O_CLOEXEC}
			found := false
			for _, h := range seen[k] {
				if h.i != i && sameFileOf(pids[h.i], pids[i], h.fd, f.Num) {
					out[i][f.Num] = &image.FDTree{PID: pids[h.i], FD: h.fd}
					found = true
					break
				}
			}
			if !found {
				num := f.Num
				mine = append(mine, func() { seen[k] = append(seen[k], holder{i, num}) })
			}
		}
		for _, add := range mine {
			add()
		}
	}
	return out
}

// sameFileOf reports whether fd a of process pa and fd b of pb are the
// same open file description.
func sameFileOf(pa, pb, a, b int) bool {
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(pa), uintptr(pb), kcmpFile, uintptr(a), uintptr(b), 0)
	return errno == 0 && r == 0
}

// treeFD returns the descriptor in the process of f, a descriptor linked
// to other processes of the tree, taken from the tree.
func (fc *fdCreator) treeFD(f *image.FD) (int, error) {
	if fc.take == nil {
		return -1, fmt.Errorf("%w: a descriptor shared with other processes of a tree, restored alone", image.ErrCorrupt)
	}
	var key string
	switch {
	case f.Tree.PID != 0:
		key = broker.OFDKey(f.Tree.PID, f.Tree.FD)
	case f.Pipe != nil:
		key = broker.PipeKey(f.Pipe.ID, f.Flags&unix.O_ACCMODE == unix.O_RDONLY)
	case f.Socket != nil:
		key = broker.UnixKey(f.Socket.ID)
	default:
		return -1, fmt.Errorf("%w: %s descriptor shared in a tree", image.ErrCorrupt, f.Kind)
	}
	fd, ok, err := fc.take(key)
	if err != nil {
		return -1, err
	}
	if !ok {
		return -1, fmt.Errorf("%w: %s is not restored before this process", image.ErrCorrupt, key)
	}
	cloexec := uint64(0)
	if f.CloExec {
		cloexec = unix.FD_CLOEXEC
	}
	if _, err := fc.in.Call(unix.SYS_FCNTL, uint64(fd), unix.F_SETFD, cloexec); err != nil {
		return -1, fmt.Errorf("fcntl(F_SETFD): %w", err)
	}
	if f.Tree.PID != 0 {
		return fd, nil // one description: its flags came with it
	}
	if err := fc.SetFlags(fd, f); err != nil {
		return -1, err
	}
	if f.Socket != nil {
		if err := fc.sock.SetOptions(fd, f.Socket); err != nil {
			return -1, err
		}
	}
	return fd, nil
}

// treePipe records one end of a pipe with ends in several processes of
// the tree; the bytes in flight are stored with one read end.
func (fx *fdDumper) treePipe(f *proc.FD, out image.FD) (image.FD, error) {
	p := fx.tree.pipes[f.Ino]
	out.Kind = image.FDPipe
	out.Pipe = &image.Pipe{ID: f.Ino}
	if p.data.pid == fx.pid && p.data.fd == f.Num {
		b, size, err := fx.peekPipe(f.Num)
		if err != nil {
			return out, fmt.Errorf("read buffered bytes: %w", err)
		}
		out.Pipe.Size, out.Pipe.Buffered = size, b
	}
	return out, nil
}

// ptyFD puts end f of a pair into the process: the master made for it,
// or a new open of the slave with f's flags.
func (fc *fdCreator) ptyFD(f *image.FD) (int, error) {
	if fc.take == nil {
		return -1, fmt.Errorf("%w: a pseudo-terminal pair restored without its broker", image.ErrCorrupt)
	}
	key := tty.PtyKey(f.Pty.Index, f.Pty.Master)
	fd, ok, err := fc.take(key)
	if err != nil {
		return -1, err
	}
	if !ok {
		return -1, fmt.Errorf("%w: pseudo-terminal %d has no master in the snapshot", image.ErrCorrupt, f.Pty.Index)
	}
	if f.Pty.Master {
		if err := fc.SetFlags(fd, f); err != nil {
			return -1, err
		}
		return fd, nil
	}
	defer fc.closeFD(fd)
	// /proc/self/fd/N is a magic link: no RESOLVE_NO_MAGICLINKS here.
	flags := f.Flags&^(unix.O_CREAT|unix.O_EXCL|unix.O_TRUNC) | unix.O_NOCTTY | unix.O_CLOEXEC
	nfd, err := fc.in.OpenAt2(fmt.Sprintf("/proc/self/fd/%d", fd), flags, 0, 0)
	if err != nil {
		return -1, fmt.Errorf("open pseudo-terminal %d's slave: %w", f.Pty.Index, err)
	}
	return nfd, nil
}
