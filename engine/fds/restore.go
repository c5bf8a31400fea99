package fds

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/ptrace"
)

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
func Restore(ctx context.Context, in *ptrace.Injector, st *image.Process, shmem map[uint64]int, log *slog.Logger) error {
	fds := st.FDs
	maxFD := 2
	for _, f := range fds {
		maxFD = max(maxFD, f.FD)
	}
	// The descriptor table must reach the highest number, and the kept
	// objects (two ends per descriptor at most) above it.
	high := maxFD + 1
	need := uint64(high + 2*len(fds) + len(shmem) + 8)
	if err := setNoFile(st, func(l image.Rlimit) unix.Rlimit {
		return unix.Rlimit{Cur: max(l.Cur, need), Max: max(l.Max, need)}
	}); err != nil {
		return fmt.Errorf("raise RLIMIT_NOFILE for %d descriptors: %w", need, err)
	}
	_, scratchLen := in.Scratch()
	fc := &fdCreator{in: in, st: st, shmem: shmem, log: log, scratchLen: scratchLen,
		high: high, pipes: map[uint64][2]int{}, pairs: map[uint64]int{}}
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
	fc.connectUnix()
	for id, fd := range shmem {
		fc.closeFD(fd)
		delete(shmem, id)
	}
	if err := fc.epollTargets(); err != nil {
		return err
	}
	// Restore the dumped limit (raised above for the move).
	if err := setNoFile(st, func(l image.Rlimit) unix.Rlimit { return unix.Rlimit{Cur: l.Cur, Max: l.Max} }); err != nil {
		return fmt.Errorf("restore RLIMIT_NOFILE: %w", err)
	}
	return nil
}

// place creates each descriptor in turn and puts it at its number.
func (fc *fdCreator) place(ctx context.Context) error {
	placed := make(map[int]bool, len(fc.st.FDs))
	for i := range fc.st.FDs {
		f := &fc.st.FDs[i]
		if err := ctx.Err(); err != nil {
			return err
		}
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
			continue
		}
		tmp, err := fc.create(f)
		if err != nil {
			return fmt.Errorf("fd %d (%s): %w", f.FD, f.Kind, err)
		}
		if tmp == f.FD {
			continue // created in place, with its close-on-exec flag
		}
		if err := fc.dup3(tmp, f.FD, flags); err != nil {
			return fmt.Errorf("fd %d: %w", f.FD, err)
		}
		if !fc.kept(tmp) {
			fc.closeFD(tmp)
		}
	}
	return nil
}

// setNoFile sets the process's RLIMIT_NOFILE, if the snapshot has one, to
// what limit makes of the dumped one.
func setNoFile(st *image.Process, limit func(image.Rlimit) unix.Rlimit) error {
	for _, l := range st.Rlimits {
		if l.Resource == unix.RLIMIT_NOFILE {
			lim := limit(l)
			return unix.Prlimit(st.PID, unix.RLIMIT_NOFILE, &lim, nil)
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
	in         *ptrace.Injector
	st         *image.Process
	shmem      map[uint64]int // shared object id -> its fd in the process
	log        *slog.Logger
	scratchLen int

	high  int               // kept objects live at this number or above
	pipes map[uint64][2]int // pipe id -> read, write end (kept)
	pairs map[uint64]int    // socket inode -> its end of a socketpair (kept)
	keep  []int             // kept fds, closed by closeAll
	inCwd bool              // the process is in its dumped working directory
	// connects are the unix datagram sockets to connect to their named
	// peer once every descriptor is in place.
	connects []*image.FD
}

// connectUnix connects each unix datagram socket to its named peer. A
// peer that is gone leaves it unconnected: the program sees its sends
// fail, as it would have.
func (fc *fdCreator) connectUnix() {
	for _, f := range fc.connects {
		at, n, err := fc.sockaddr(f.Socket.Family, f.Socket.Peer)
		if err == nil {
			_, err = fc.in.Call(unix.SYS_CONNECT, uint64(f.FD), at, n)
		}
		if err != nil {
			fc.log.Warn("unix socket not connected again", "fd", f.FD, "peer", f.Socket.Peer, "err", err)
		}
	}
}

// epollTargets registers every epoll instance's targets, all in place.
func (fc *fdCreator) epollTargets() error {
	for _, f := range fc.st.FDs {
		if f.Epoll == nil {
			continue
		}
		for _, t := range f.Epoll.Targets {
			at, err := fc.in.Put(0, epollEvent(t.Events, t.Data))
			if err != nil {
				return err
			}
			if _, err := fc.in.Call(unix.SYS_EPOLL_CTL, uint64(f.FD), unix.EPOLL_CTL_ADD, uint64(t.FD), at); err != nil {
				return fmt.Errorf("fd %d: epoll_ctl(ADD, %d, %#x): %w", f.FD, t.FD, t.Events, err)
			}
		}
	}
	return nil
}

// kept reports whether fd is a kept object, which stays open.
func (fc *fdCreator) kept(fd int) bool {
	return slices.Contains(fc.keep, fd)
}

// moveHigh moves fd of the process to the first free number from high
// up (close-on-exec) and returns it.
func (fc *fdCreator) moveHigh(fd int) (int, error) {
	nfd, err := fc.in.Call(unix.SYS_FCNTL, uint64(fd), unix.F_DUPFD_CLOEXEC, uint64(fc.high))
	if err != nil {
		return -1, fmt.Errorf("fcntl(%d, F_DUPFD_CLOEXEC, %d): %w", fd, fc.high, err)
	}
	fc.closeFD(fd)
	return int(nfd), nil
}

// keepPair moves the two fds a pipe2 or socketpair wrote at scratch out
// of the way and keeps them.
func (fc *fdCreator) keepPair(at uint64) ([2]int, error) {
	var b [8]byte
	if err := fc.in.Get(0, b[:]); err != nil {
		return [2]int{}, err
	}
	var out [2]int
	for i := range out {
		fd, err := fc.moveHigh(int(binary.LittleEndian.Uint32(b[4*i:])))
		if err != nil {
			return [2]int{}, err
		}
		out[i] = fd
		fc.keep = append(fc.keep, fd)
	}
	return out, nil
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
	switch f.Kind {
	case image.FDFile, image.FDDir, image.FDChr:
		fd, err := fc.in.OpenAt(f.Path, f.Flags&^(unix.O_CREAT|unix.O_EXCL|unix.O_TRUNC|unix.O_NOCTTY)|unix.O_NOCTTY|int(cloexec), 0)
		if err != nil {
			return -1, err
		}
		if f.Pos != 0 && f.Flags&unix.O_APPEND == 0 {
			if _, err := fc.in.Call(unix.SYS_LSEEK, uint64(fd), uint64(f.Pos), unix.SEEK_SET); err != nil {
				return -1, fmt.Errorf("lseek %s to %d: %w", f.Path, f.Pos, err)
			}
		}
		return fd, nil
	case image.FDFifo:
		return fc.fifo(f, int(cloexec))
	case image.FDMemfd:
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
	case image.FDPipe:
		return fc.pipe(f, nonblock)
	case image.FDEventfd:
		flags := nonblock | cloexec
		if f.Eventfd.Semaphore {
			flags |= unix.EFD_SEMAPHORE
		}
		fd, err := fc.in.Call(unix.SYS_EVENTFD2, 0, flags)
		if err != nil {
			return -1, fmt.Errorf("eventfd2: %w", err)
		}
		if c := f.Eventfd.Count; c > 0 {
			if err := fc.write(int(fd), binary.LittleEndian.AppendUint64(nil, c)); err != nil {
				return -1, fmt.Errorf("eventfd count %d: %w", c, err)
			}
		}
		return int(fd), nil
	case image.FDEpoll:
		fd, err := fc.in.Call(unix.SYS_EPOLL_CREATE1, cloexec)
		if err != nil {
			return -1, fmt.Errorf("epoll_create1: %w", err)
		}
		if nonblock != 0 {
			if err := fc.setFlags(int(fd), f); err != nil {
				return -1, err
			}
		}
		return int(fd), nil
	case image.FDTimerfd:
		return fc.timerfd(f, nonblock|cloexec)
	case image.FDSignalfd:
		at, err := fc.in.Put(0, binary.LittleEndian.AppendUint64(nil, f.Signalfd.Mask))
		if err != nil {
			return -1, err
		}
		fd, err := fc.in.Call(unix.SYS_SIGNALFD4, ^uint64(0), at, 8, nonblock|cloexec)
		if err != nil {
			return -1, fmt.Errorf("signalfd4: %w", err)
		}
		return int(fd), nil
	case image.FDSocket:
		return fc.socket(f, nonblock|cloexec)
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

// fifo opens a named FIFO without blocking: a read end opens with
// O_NONBLOCK, a write end once a read end exists (held for the open).
func (fc *fdCreator) fifo(f *image.FD, cloexec int) (int, error) {
	acc := f.Flags & unix.O_ACCMODE
	flags := f.Flags &^ (unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC)
	holder := -1
	if acc == unix.O_WRONLY {
		var err error
		if holder, err = fc.in.OpenAt(f.Path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err != nil {
			return -1, err
		}
		defer fc.closeFD(holder)
	}
	fd, err := fc.in.OpenAt(f.Path, flags|unix.O_NONBLOCK|cloexec, 0)
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

// pipe returns this end of the pipe, creating the pipe (with its buffered
// bytes) the first time one of its ends is met.
func (fc *fdCreator) pipe(f *image.FD, nonblock uint64) (int, error) {
	ends, ok := fc.pipes[f.Pipe.ID]
	if !ok {
		at, _ := fc.in.Scratch()
		if _, err := fc.in.Call(unix.SYS_PIPE2, at, unix.O_CLOEXEC); err != nil {
			return -1, fmt.Errorf("pipe2: %w", err)
		}
		var err error
		if ends, err = fc.keepPair(at); err != nil {
			return -1, err
		}
		fc.pipes[f.Pipe.ID] = ends
		// Find the dumped size and bytes, stored with one read end.
		for _, g := range fc.st.FDs {
			if g.Pipe == nil || g.Pipe.ID != f.Pipe.ID || (g.Pipe.Size == 0 && len(g.Pipe.Buffered) == 0) {
				continue
			}
			if g.Pipe.Size > 0 {
				if _, err := fc.in.Call(unix.SYS_FCNTL, uint64(ends[1]), unix.F_SETPIPE_SZ, uint64(g.Pipe.Size)); err != nil {
					return -1, fmt.Errorf("F_SETPIPE_SZ %d: %w", g.Pipe.Size, err)
				}
			}
			if err := fc.write(ends[1], g.Pipe.Buffered); err != nil {
				return -1, fmt.Errorf("refill pipe with %d bytes: %w", len(g.Pipe.Buffered), err)
			}
		}
	}
	end := ends[1]
	if f.Flags&unix.O_ACCMODE == unix.O_RDONLY {
		end = ends[0]
	}
	if err := fc.setFlags(end, f); err != nil {
		return -1, err
	}
	return end, nil
}

// setFlags sets the file status flags that F_SETFL can change.
func (fc *fdCreator) setFlags(fd int, f *image.FD) error {
	const settable = unix.O_NONBLOCK | unix.O_DIRECT | unix.O_APPEND | unix.O_NOATIME
	if _, err := fc.in.Call(unix.SYS_FCNTL, uint64(fd), unix.F_SETFL, uint64(f.Flags&settable)); err != nil {
		return fmt.Errorf("fcntl(F_SETFL, %#x): %w", f.Flags&settable, err)
	}
	return nil
}

// tfdIocSetTicks is TFD_IOC_SET_TICKS, _IOW('T', 0, u64).
const tfdIocSetTicks = 0x40085400

func (fc *fdCreator) timerfd(f *image.FD, flags uint64) (int, error) {
	t := f.Timerfd
	fd, err := fc.in.Call(unix.SYS_TIMERFD_CREATE, uint64(t.Clock), flags)
	if err != nil {
		return -1, fmt.Errorf("timerfd_create(%d): %w", t.Clock, err)
	}
	value := t.ValueNs
	if value <= 0 && t.IntervalNs != 0 {
		// A periodic timer that expired and was not read since is not
		// re-armed until it is (fdinfo shows no time remaining): it
		// fires again at once, and its pending ticks are set below.
		value = 1
	}
	settime := uint64(0)
	if value > 0 && t.Flags&unix.TFD_TIMER_ABSTIME != 0 {
		// fdinfo gives the time remaining even for an absolute timer:
		// it expires that long from now on its clock, and keeps its
		// flags (TFD_TIMER_CANCEL_ON_SET with them).
		var now unix.Timespec
		if err := unix.ClockGettime(int32(t.Clock), &now); err != nil {
			return -1, fmt.Errorf("clock_gettime(%d): %w", t.Clock, err)
		}
		value += now.Nano()
		settime = uint64(t.Flags & (unix.TFD_TIMER_ABSTIME | unix.TFD_TIMER_CANCEL_ON_SET))
	}
	if value > 0 {
		// fdinfo gives the time remaining: set it relative (or
		// absolute, above).
		its := make([]byte, 32)
		le := binary.LittleEndian
		le.PutUint64(its[0:], uint64(t.IntervalNs/1e9))
		le.PutUint64(its[8:], uint64(t.IntervalNs%1e9))
		le.PutUint64(its[16:], uint64(value/1e9))
		le.PutUint64(its[24:], uint64(value%1e9))
		at, err := fc.in.Put(0, its)
		if err != nil {
			return -1, err
		}
		if _, err := fc.in.Call(unix.SYS_TIMERFD_SETTIME, fd, settime, at, 0); err != nil {
			return -1, fmt.Errorf("timerfd_settime: %w", err)
		}
	}
	if t.Ticks > 0 {
		at, err := fc.in.Put(0, binary.LittleEndian.AppendUint64(nil, t.Ticks))
		if err != nil {
			return -1, err
		}
		if _, err := fc.in.Call(unix.SYS_IOCTL, fd, tfdIocSetTicks, at); err != nil {
			return -1, fmt.Errorf("timerfd: set %d pending ticks: %w", t.Ticks, err)
		}
	}
	return int(fd), nil
}

// socket recreates a socket in its state: listening and bound sockets are
// bound (and listen) again at their address with their options, socket
// pairs are paired again with the data that was queued in them, a
// datagram socket connected to an address is connected again. A
// connection (established TCP, or a unix stream connected to a process
// outside) cannot follow the process: it comes back as a socket whose
// peer has closed, on which the program reads end-of-file (its peer saw
// the connection reset when the dumped process went away).
//
// flags are O_NONBLOCK and O_CLOEXEC, the same bits as SOCK_NONBLOCK and
// SOCK_CLOEXEC.
func (fc *fdCreator) socket(f *image.FD, flags uint64) (int, error) {
	s := f.Socket
	typ := uint64(s.Type) | flags&(unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
	if s.Family == unix.AF_UNIX {
		if _, paired := s.Options[peerInodeOption]; paired && s.State == sockConnected {
			return fc.socketPair(f, typ)
		}
		if isConnection(s.State) {
			return fc.closedUnix(f, typ)
		}
	}
	fd, err := fc.in.Call(unix.SYS_SOCKET, uint64(s.Family), typ, uint64(s.Protocol))
	if err != nil {
		return -1, fmt.Errorf("socket(%d, %d, %d): %w", s.Family, s.Type, s.Protocol, err)
	}
	if isConnection(s.State) {
		// A fresh TCP socket whose receive side is shut down reads as a
		// connection the peer closed: read returns 0, poll reports
		// EPOLLIN|EPOLLRDHUP|EPOLLHUP. (shutdown sets the flag even as
		// it returns ENOTCONN for the unconnected socket.) Its options
		// are not set: the program is about to close it.
		fc.in.Syscall(unix.SYS_SHUTDOWN, fd, unix.SHUT_RD)
		fc.log.Info("connection closed by restore", "fd", f.FD, "local", s.Local, "peer", s.Peer, "state", s.State)
		return int(fd), nil
	}
	if err := fc.sockOpts(int(fd), s); err != nil {
		return -1, err
	}
	switch s.State {
	case sockListen, sockBound:
		if s.Local != "" {
			if err := fc.bind(int(fd), s); err != nil {
				return -1, err
			}
		}
	case sockConnected:
		// The local address of a connected datagram socket is most often
		// an ephemeral port: connect picks another if it is taken.
		if s.Local != "" && !(s.Family == unix.AF_UNIX && s.Local == "@") {
			if err := fc.bind(int(fd), s); err != nil {
				fc.log.Warn("connected socket not bound to its address again", "fd", f.FD, "local", s.Local, "err", err)
			}
		}
	}
	switch {
	case s.State == sockListen:
		backlog := s.Backlog
		if backlog <= 0 {
			backlog = unix.SOMAXCONN
		}
		if _, err := fc.in.Call(unix.SYS_LISTEN, fd, uint64(backlog)); err != nil {
			return -1, fmt.Errorf("listen(%s, %d): %w", s.Local, backlog, err)
		}
	case s.State == sockConnected && s.Peer != "" && s.Family == unix.AF_UNIX:
		// Its peer may be a socket of the process not bound yet.
		fc.connects = append(fc.connects, f)
	case s.State == sockConnected && s.Peer != "":
		at, n, err := fc.sockaddr(s.Family, s.Peer)
		if err != nil {
			return -1, err
		}
		if _, err := fc.in.Call(unix.SYS_CONNECT, fd, at, n); err != nil {
			return -1, fmt.Errorf("connect %s: %w", s.Peer, err)
		}
	}
	return int(fd), nil
}

// isConnection reports whether a socket state is a connection that
// restore closes.
func isConnection(state string) bool {
	return state == sockEstablished || strings.HasPrefix(state, "tcp-state-")
}

// closedUnix returns one end of a new unix socket pair whose other end is
// closed: it stands for a connection to a process outside, which the
// program sees closed by its peer.
func (fc *fdCreator) closedUnix(f *image.FD, typ uint64) (int, error) {
	at, _ := fc.in.Scratch()
	if _, err := fc.in.Call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, typ, 0, at); err != nil {
		return -1, fmt.Errorf("socketpair: %w", err)
	}
	var b [8]byte
	if err := fc.in.Get(0, b[:]); err != nil {
		return -1, err
	}
	fc.closeFD(int(binary.LittleEndian.Uint32(b[4:])))
	fd := int(binary.LittleEndian.Uint32(b[0:]))
	fc.log.Info("connection closed by restore", "fd", f.FD, "local", f.Socket.Local, "peer", f.Socket.Peer, "state", f.Socket.State)
	return fd, nil
}

// sockOpts sets the recorded options.
func (fc *fdCreator) sockOpts(fd int, s *image.Socket) error {
	opts := sockOptions(s.Family, s.Type)
	for name, v := range s.Options {
		o, ok := opts[name]
		if !ok {
			continue
		}
		if name == "SO_RCVLOWAT" && v == 1 {
			continue
		}
		if v == 0 && name != "IPV6_V6ONLY" {
			continue // the default
		}
		if err := fc.setInt(fd, o.level, o.opt, v); err != nil {
			return fmt.Errorf("setsockopt %s=%d: %w", name, v, err)
		}
	}
	return nil
}

// setInt sets an int socket option of fd in the process.
func (fc *fdCreator) setInt(fd, level, opt, v int) error {
	at, err := fc.in.Put(0, binary.LittleEndian.AppendUint32(nil, uint32(v)))
	if err != nil {
		return err
	}
	_, err = fc.in.Call(unix.SYS_SETSOCKOPT, uint64(fd), uint64(level), uint64(opt), at, 4)
	return err
}

// bind binds fd to the socket's local address; a unix socket's stale
// file is removed first, as a server starting up would. A relative unix
// path is taken from the process's working directory.
func (fc *fdCreator) bind(fd int, s *image.Socket) error {
	if s.Family == unix.AF_UNIX && !strings.HasPrefix(s.Local, "@") {
		if !strings.HasPrefix(s.Local, "/") && !fc.inCwd {
			// The process state step sets the directory again later.
			a, err := fc.in.PutString(0, fc.st.Cwd)
			if err != nil {
				return err
			}
			if _, err := fc.in.Call(unix.SYS_CHDIR, a); err != nil {
				return fmt.Errorf("chdir %s to bind %s: %w", fc.st.Cwd, s.Local, err)
			}
			fc.inCwd = true
		}
		a, err := fc.in.PutString(0, s.Local)
		if err != nil {
			return err
		}
		fc.in.Syscall(unix.SYS_UNLINKAT, ptrace.AtFDCWD, a, 0) // ENOENT is fine
	}
	at, n, err := fc.sockaddr(s.Family, s.Local)
	if err != nil {
		return err
	}
	if _, err := fc.in.Call(unix.SYS_BIND, uint64(fd), at, n); err != nil {
		if errors.Is(err, unix.EADDRINUSE) && s.Type == unix.SOCK_STREAM && s.Family != unix.AF_UNIX && s.Options["SO_REUSEADDR"] == 0 {
			err = fmt.Errorf("%w (the socket has no SO_REUSEADDR: connections in TIME_WAIT on the port refuse it until they expire)", err)
		}
		return fmt.Errorf("bind %s: %w", s.Local, err)
	}
	return nil
}

// sockaddrOff is where in scratch sockaddr puts an address: past the
// strings (paths) that other arguments put at its start.
const sockaddrOff = 1024

// sockaddr writes a sockaddr into scratch and returns its address and
// length.
func (fc *fdCreator) sockaddr(family int, addr string) (uint64, uint64, error) {
	var b []byte
	le := binary.LittleEndian
	switch family {
	case unix.AF_INET, unix.AF_INET6:
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return 0, 0, fmt.Errorf("%w: address %q", image.ErrCorrupt, addr)
		}
		port := []byte{byte(ap.Port() >> 8), byte(ap.Port())}
		if family == unix.AF_INET {
			b = make([]byte, 16)
			le.PutUint16(b, unix.AF_INET)
			copy(b[2:], port)
			a4 := ap.Addr().Unmap().As4()
			copy(b[4:], a4[:])
		} else {
			b = make([]byte, 28)
			le.PutUint16(b, unix.AF_INET6)
			copy(b[2:], port)
			a16 := ap.Addr().As16()
			copy(b[8:], a16[:])
		}
	case unix.AF_UNIX:
		name := []byte(addr)
		if strings.HasPrefix(addr, "@") {
			name[0] = 0
		} else {
			name = append(name, 0)
		}
		if len(name) > 108 {
			return 0, 0, fmt.Errorf("unix socket path %q too long", addr)
		}
		b = make([]byte, 2+len(name))
		le.PutUint16(b, unix.AF_UNIX)
		copy(b[2:], name)
	default:
		return 0, 0, fmt.Errorf("%w: address family %d", image.ErrUnsupported, family)
	}
	at, err := fc.in.Put(sockaddrOff, b)
	if err != nil {
		return 0, 0, err
	}
	return at, uint64(len(b)), nil
}

// socketPair returns this end of a unix socket pair whose both ends are
// in the process, creating the pair, with the data queued in each end,
// the first time one of its ends is met.
func (fc *fdCreator) socketPair(f *image.FD, typ uint64) (int, error) {
	s := f.Socket
	if end, ok := fc.pairs[s.ID]; ok {
		if err := fc.setFlags(end, f); err != nil {
			return -1, err
		}
		if err := fc.sockOpts(end, s); err != nil {
			return -1, err
		}
		return end, nil
	}
	at, _ := fc.in.Scratch()
	if _, err := fc.in.Call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, typ, 0, at); err != nil {
		return -1, fmt.Errorf("socketpair: %w", err)
	}
	ends, err := fc.keepPair(at)
	if err != nil {
		return -1, err
	}
	a, c := ends[0], ends[1]
	peer := uint64(s.Options[peerInodeOption])
	fc.pairs[s.ID] = a
	fc.pairs[peer] = c
	if err := fc.sockOpts(a, s); err != nil {
		return -1, err
	}
	// What waits in one end was sent from the other.
	if err := fc.send(c, s.Type, s.Queued); err != nil {
		return -1, fmt.Errorf("queue %d messages again: %w", len(s.Queued), err)
	}
	for _, g := range fc.st.FDs {
		if g.Socket != nil && g.Socket.ID == peer && g.SameAs == nil {
			if err := fc.send(a, s.Type, g.Socket.Queued); err != nil {
				return -1, fmt.Errorf("queue %d messages again in the peer: %w", len(g.Socket.Queued), err)
			}
			break
		}
	}
	if err := fc.setFlags(a, f); err != nil {
		return -1, err
	}
	return a, nil
}

// send sends msgs on a socket of the process without blocking: a stream
// in pieces, each datagram whole.
func (fc *fdCreator) send(fd, typ int, msgs [][]byte) error {
	for _, m := range msgs {
		if typ != unix.SOCK_STREAM && len(m) > fc.scratchLen {
			return fmt.Errorf("%w: a queued message of %d bytes (at most %d)", image.ErrUnsupported, len(m), fc.scratchLen)
		}
		for len(m) > 0 || typ != unix.SOCK_STREAM {
			n := min(len(m), fc.scratchLen)
			at, err := fc.in.Put(0, m[:n])
			if err != nil {
				return err
			}
			w, err := fc.in.Call(unix.SYS_SENDTO, uint64(fd), at, uint64(n), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
			if err != nil {
				return fmt.Errorf("send %d bytes: %w", n, err)
			}
			if typ != unix.SOCK_STREAM {
				break
			}
			if w == 0 {
				return fmt.Errorf("send to fd %d made no progress", fd)
			}
			m = m[w:]
		}
	}
	return nil
}
