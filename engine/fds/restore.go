package fds

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds/sock"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
)

// RestoreOptions configure Restore.
type RestoreOptions struct {
	Log *slog.Logger
	// TCPEstablished brings the connections the dump took with TCP_REPAIR
	// back connected; without it they come back closed.
	TCPEstablished bool
	// Inherit maps the key of a descriptor leading outside ("pipe:[INO]",
	// "socket:[INO]", or "fd[N]" for the dumped process's descriptor N,
	// or that of any process of a tree) to a descriptor of the caller
	// that takes its place (ParseInherit).
	Inherit map[string]int
	// ExternalFallback is what a descriptor leading outside that Inherit
	// does not give becomes: ExternalRefuse ("" too) or ExternalNull.
	ExternalFallback string
	// ShellJob says that Inherit[tty.TerminalKey] is the caller's terminal,
	// given to the descriptors on a terminal outside the process if there
	// are any (restore --shell-job), and not an error if there are none.
	ShellJob bool
	// Tree, for a process of a tree, hands out the descriptors it shares
	// with the other processes (DumpTree); nil for a single process.
	Tree Tree
	// Foreign says the process lives in a mount namespace not snapctl's
	// (a container's, restore --into): snapctl leaves its files alone (a
	// stale socket file at a path it binds is not removed here, where the
	// path names another file).
	Foreign bool
}

// Restore recreates every file descriptor of st in the process that in
// injects into, at its number, with its flags, in ascending order. A new
// object takes the lowest free number, which is most often its own (the
// numbers below are placed already), so a descriptor costs no move at all;
// otherwise it is moved there with dup3. Objects shared by several
// descriptors (pipe and socket pair ends) and the shared memory objects
// still open from mapping memory (shmem: object id to its descriptor in
// the process, closed here) are kept above every number the process uses
// until all are placed. Epoll registrations are made last: their targets
// must be in place.
func Restore(ctx context.Context, in *syscalls.Injector, st *image.Process, shmem map[uint64]int, o RestoreOptions) error {
	fc := newFDCreator(in, in.Thread().Process().Pid(), st, shmem, o)
	if o.Tree != nil {
		fc.take = func(key string) (int, bool, error) { return o.Tree.Take(in, key) }
	}
	defer fc.close()
	return fc.restore(ctx)
}

// newFDCreator prepares the restore of the descriptors of st in the
// process that in injects into, pid in our pid namespace; shmem and o are
// Restore's. The caller closes it.
func newFDCreator(in injector, pid int, st *image.Process, shmem map[uint64]int, o RestoreOptions) *fdCreator {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	_, scratchLen := in.Scratch()
	fc := &fdCreator{in: in, pid: pid, st: st, shmem: shmem, log: log, opts: o, scratchLen: scratchLen,
		pipes: map[uint64][2]int{}, pfd: -1}
	fc.sock = sock.Restorer{In: in, Host: fc, Proc: st, Log: log, TCPEstablished: o.TCPEstablished, Foreign: o.Foreign}
	return fc
}

// close closes the pidfd the restore opened, if it did.
func (fc *fdCreator) close() {
	if fc.pfd >= 0 {
		unix.Close(fc.pfd)
	}
}

// restore is Restore's work, once its fdCreator is made.
func (fc *fdCreator) restore(ctx context.Context) error {
	fds, shmem := fc.st.FDs, fc.shmem
	maxFD := 2
	for _, f := range fds {
		maxFD = max(maxFD, f.FD)
	}
	// The descriptor table must reach the highest number, and the kept
	// objects (two ends per descriptor at most) above it.
	fc.high = maxFD + 1
	need := uint64(fc.high + 2*len(fds) + len(shmem) + 8)
	if err := fc.setNoFile(func(l image.Rlimit) unix.Rlimit {
		return unix.Rlimit{Cur: max(l.Cur, need), Max: max(l.Max, need)}
	}); err != nil {
		return fmt.Errorf("raise RLIMIT_NOFILE for %d descriptors: %w", need, err)
	}
	for id, fd := range shmem {
		nfd, err := fc.moveHigh(fd)
		if err != nil {
			return err
		}
		shmem[id] = nfd
	}
	if err := fc.place(ctx); err != nil {
		return err
	}
	fc.closeAll()
	fc.sock.ConnectUnix()
	for id, fd := range shmem {
		fc.closeFD(fd)
		delete(shmem, id)
	}
	if err := fc.epollTargets(); err != nil {
		return err
	}
	if err := fc.takeLocks(); err != nil {
		return err
	}
	// Restore the dumped limit (raised above for the move).
	if err := fc.setNoFile(func(l image.Rlimit) unix.Rlimit { return unix.Rlimit{Cur: l.Cur, Max: l.Max} }); err != nil {
		return fmt.Errorf("restore RLIMIT_NOFILE: %w", err)
	}
	return nil
}

// place creates each descriptor in turn and puts it at its number.
// TCP connections brought back with TCP_REPAIR come last, after the
// listeners: a repaired socket takes its port whatever holds it, but a
// listener without SO_REUSEADDR could not bind a port such a socket holds.
// (Their numbers stay free meanwhile: a descriptor is made at the lowest
// free number only for as long as it takes to move it to its own.)
func (fc *fdCreator) place(ctx context.Context) error {
	placed := make(map[int]bool, len(fc.st.FDs))
	var repaired map[int]bool
	for pass := range 2 {
		for i := range fc.st.FDs {
			f := &fc.st.FDs[i]
			last := fc.repairs(f) || f.SameAs != nil && repaired[*f.SameAs]
			if last {
				if repaired == nil {
					repaired = map[int]bool{}
				}
				repaired[f.FD] = true
			}
			if last != (pass == 1) {
				continue
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := fc.placeOne(f, placed); err != nil {
				return err
			}
		}
	}
	return nil
}

// repairs reports whether f is a TCP connection brought back with
// TCP_REPAIR.
func (fc *fdCreator) repairs(f *image.FD) bool {
	return fc.opts.TCPEstablished && f.Socket != nil && f.Socket.TCP != nil && f.External == ""
}

// placeOne creates the descriptor f (or duplicates the one it shares its
// file with) at its number.
func (fc *fdCreator) placeOne(f *image.FD, placed map[int]bool) error {
	flags := 0
	if f.CloExec {
		flags = unix.O_CLOEXEC
	}
	if placed[f.FD] {
		return fmt.Errorf("%w: fd %d appears twice", image.ErrCorrupt, f.FD)
	}
	placed[f.FD] = true
	if f.SameAs != nil {
		// A dup of a lower descriptor, in place already.
		if *f.SameAs >= f.FD || !placed[*f.SameAs] {
			return fmt.Errorf("%w: fd %d shares the file of fd %d, which is not before it", image.ErrCorrupt, f.FD, *f.SameAs)
		}
		if err := fc.dup3(*f.SameAs, f.FD, flags); err != nil {
			return fmt.Errorf("fd %d: %w", f.FD, err)
		}
		return nil
	}
	tmp, err := fc.create(f)
	if err != nil {
		return fmt.Errorf("pid %d fd %d (%s): %w", fc.st.PID, f.FD, f.Kind, err)
	}
	if tmp == f.FD {
		return nil // created in place, with its close-on-exec flag
	}
	// Moved to its number and the temporary closed in one resume; a pipe
	// end made here gets its file status flags there too (pipe), not one
	// from outside or from another process of the tree.
	var c calls
	c.add(fmt.Sprintf("dup3(%d, %d)", tmp, f.FD), unix.SYS_DUP3, uint64(tmp), uint64(f.FD), uint64(flags))
	if f.Kind == image.FDPipe && f.Tree == nil && f.Pty == nil && f.External == "" {
		c.add(fmt.Sprintf("fcntl(%d, F_SETFL, %#x)", f.FD, f.Flags&settableFlags), unix.SYS_FCNTL, uint64(f.FD), unix.F_SETFL, uint64(f.Flags&settableFlags))
	}
	if !fc.kept(tmp) {
		c.add(fmt.Sprintf("close(%d)", tmp), unix.SYS_CLOSE, uint64(tmp))
	}
	if err := fc.run(&c); err != nil {
		return fmt.Errorf("fd %d: %w", f.FD, err)
	}
	return nil
}

// setNoFile sets the process's RLIMIT_NOFILE, if the snapshot has one, to
// what limit makes of the dumped one.
func (fc *fdCreator) setNoFile(limit func(image.Rlimit) unix.Rlimit) error {
	for _, l := range fc.st.Rlimits {
		if l.Resource == unix.RLIMIT_NOFILE {
			lim := limit(l)
			return unix.Prlimit(fc.pid, unix.RLIMIT_NOFILE, &lim, nil)
		}
	}
	return nil
}

func (fc *fdCreator) dup3(from, to, flags int) error {
	if _, err := fc.in.Call(unix.SYS_DUP3, uint64(from), uint64(to), uint64(flags)); err != nil {
		return fmt.Errorf("dup3(%d, %d): %w", from, to, err)
	}
	return nil
}

// closeFD closes fd in the process; a failure is only logged.
func (fc *fdCreator) closeFD(fd int) {
	if err := fc.in.CloseFD(fd); err != nil {
		fc.log.Warn("close in restored process", "fd", fd, "err", err)
	}
}

// fdCreator creates the kernel objects behind descriptors; objects shared
// by several descriptors (pipe ends, socket pairs) are created once and
// kept at numbers from high up until every descriptor is placed.
type fdCreator struct {
	in    injector
	pid   int // of the process, in our pid namespace (not st.PID in a new one)
	st    *image.Process
	shmem map[uint64]int // shared object id -> its fd in the process
	// take takes from the other processes of the tree (RestoreOptions.Tree)
	// the object of a key, into the process; nil for a single process.
	take       func(key string) (fd int, ok bool, err error)
	log        *slog.Logger
	opts       RestoreOptions
	scratchLen int
	pfd        int // a pidfd of the process, once opened (Pidfd), or -1

	high  int               // kept objects live at this number or above
	pipes map[uint64][2]int // pipe id -> read, write end (kept)
	keep  []int             // kept fds, closed by closeAll
	// sock restores the sockets; fc is its sock.Host, keeping the ends
	// of a socket pair with the pipes' (KeepPair).
	sock sock.Restorer
}

// kept reports whether fd is a kept object, which stays open.
func (fc *fdCreator) kept(fd int) bool {
	return slices.Contains(fc.keep, fd)
}

// moveHigh moves fd of the process to the first free number from high
// up (close-on-exec) and returns it.
func (fc *fdCreator) moveHigh(fd int) (int, error) {
	fds, err := fc.moveHighAll(fd)
	if err != nil {
		return -1, err
	}
	return fds[0], nil
}

// moveHighAll is moveHigh of every fd, in one resume of the process.
func (fc *fdCreator) moveHighAll(fds ...int) ([]int, error) {
	var c calls
	for _, fd := range fds {
		c.add(fmt.Sprintf("fcntl(%d, F_DUPFD_CLOEXEC, %d)", fd, fc.high), unix.SYS_FCNTL, uint64(fd), unix.F_DUPFD_CLOEXEC, uint64(fc.high))
	}
	for _, fd := range fds {
		c.add(fmt.Sprintf("close(%d)", fd), unix.SYS_CLOSE, uint64(fd))
	}
	if err := fc.run(&c); err != nil {
		// Those moved are closed; the originals, if a close failed,
		// are left to the process's death.
		for i := range fds {
			if r := c.result(i); r >= int64(fc.high) {
				fc.closeFD(int(r))
			}
		}
		return nil, err
	}
	out := make([]int, len(fds))
	for i := range fds {
		out[i] = int(c.result(i))
	}
	return out, nil
}

// KeepPair moves the two fds a pipe2 or socketpair wrote at scratch out
// of the way and keeps them.
func (fc *fdCreator) KeepPair(at uint64) ([2]int, error) {
	var b [8]byte
	if err := fc.in.Get(0, b[:]); err != nil {
		return [2]int{}, err
	}
	moved, err := fc.moveHighAll(int(binary.LittleEndian.Uint32(b[0:])), int(binary.LittleEndian.Uint32(b[4:])))
	if err != nil {
		return [2]int{}, err
	}
	fc.keep = append(fc.keep, moved...)
	return [2]int{moved[0], moved[1]}, nil
}

func (fc *fdCreator) closeAll() {
	for _, k := range fc.keep {
		fc.closeFD(k)
	}
	fc.keep = nil
}

// create creates the object of f in the process, with its flags and
// close-on-exec flag (the same bit, O_CLOEXEC, for every kind), and returns
// the descriptor: a new one at the lowest free number, or a kept one.
func (fc *fdCreator) create(f *image.FD) (int, error) {
	nonblock := uint64(0)
	if f.Flags&unix.O_NONBLOCK != 0 {
		nonblock = unix.O_NONBLOCK
	}
	cloexec := uint64(0)
	if f.CloExec {
		cloexec = unix.O_CLOEXEC
	}
	if f.Tree != nil {
		return fc.treeFD(f)
	}
	if f.Pty != nil {
		return fc.ptyFD(f)
	}
	if f.External != "" {
		return fc.external(f)
	}
	switch f.Kind {
	case image.FDFile, image.FDDir, image.FDChr:
		return fc.file(f, cloexec)
	case image.FDFifo:
		return fc.fifo(f, int(cloexec))
	case image.FDMemfd:
		return fc.memfd(f)
	case image.FDPipe:
		return fc.pipe(f, nonblock)
	case image.FDEventfd:
		return fc.eventfd(f, nonblock|cloexec)
	case image.FDEpoll:
		return fc.epoll(f, nonblock, cloexec)
	case image.FDTimerfd:
		return fc.timerfd(f, nonblock|cloexec)
	case image.FDSignalfd:
		return fc.signalfd(f, nonblock|cloexec)
	case image.FDSocket:
		return fc.sock.Socket(f, nonblock|cloexec)
	}
	return -1, fmt.Errorf("%w: %s descriptors", image.ErrUnsupported, f.Kind)
}

// write writes b into fd of the process, through scratch.
func (fc *fdCreator) write(fd int, b []byte) error {
	for len(b) > 0 {
		n := min(len(b), fc.scratchLen)
		at, err := fc.in.Put(0, b[:n])
		if err != nil {
			return err
		}
		w, err := fc.in.Call(unix.SYS_WRITE, uint64(fd), at, uint64(n))
		if err != nil {
			return err
		}
		if w == 0 {
			return fmt.Errorf("write to fd %d made no progress", fd)
		}
		b = b[w:]
	}
	return nil
}

// SetFlags sets the file status flags that F_SETFL can change.
func (fc *fdCreator) SetFlags(fd int, f *image.FD) error {
	if _, err := fc.in.Call(unix.SYS_FCNTL, uint64(fd), unix.F_SETFL, uint64(f.Flags&settableFlags)); err != nil {
		return fmt.Errorf("fcntl(F_SETFL, %#x): %w", f.Flags&settableFlags, err)
	}
	return nil
}

// settableFlags are the file status flags F_SETFL sets.
const settableFlags = unix.O_NONBLOCK | unix.O_DIRECT | unix.O_APPEND | unix.O_NOATIME
