package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

// restoreFDs recreates every file descriptor at its number, with its
// flags. Objects are created first and parked above the highest number the
// process uses, then moved into place, then epoll registrations are made
// (their targets must be in place).
func (r *restorer) restoreFDs(ctx context.Context) error {
	fds := r.st.FDs
	maxFD := 2
	for _, f := range fds {
		maxFD = max(maxFD, f.FD)
	}
	// The descriptor table must reach the highest number.
	for _, l := range r.st.Rlimits {
		if l.Resource == unix.RLIMIT_NOFILE {
			lim := unix.Rlimit{Cur: max(l.Cur, uint64(2*maxFD+len(fds)+16)), Max: max(l.Max, uint64(2*maxFD+len(fds)+16))}
			if err := unix.Prlimit(r.st.PID, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
				return fmt.Errorf("raise RLIMIT_NOFILE for %d descriptors: %w", maxFD+1, err)
			}
		}
	}
	park := maxFD + 1
	fc := &fdCreator{r: r, pipes: map[uint64][2]int{}, pairs: map[uint64]int{}}
	for i := range fds {
		f := &fds[i]
		tmp, err := fc.create(f)
		if err != nil {
			return fmt.Errorf("fd %d (%s): %w", f.FD, f.Kind, err)
		}
		if err := r.dup3(tmp, park+i, 0); err != nil {
			return fmt.Errorf("fd %d: %w", f.FD, err)
		}
		if fc.owned(tmp) {
			r.closeFD(tmp)
		}
	}
	fc.closeAll()
	for _, fd := range r.shmem {
		r.closeFD(fd)
	}
	r.shmem = nil
	for i, f := range fds {
		flags := 0
		if f.CloExec {
			flags = unix.O_CLOEXEC
		}
		if err := r.dup3(park+i, f.FD, flags); err != nil {
			return fmt.Errorf("fd %d: %w", f.FD, err)
		}
		r.closeFD(park + i)
	}
	for _, f := range fds {
		if f.Epoll == nil {
			continue
		}
		for _, t := range f.Epoll.Targets {
			ev := make([]byte, 12) // struct epoll_event is packed on x86-64
			binary.LittleEndian.PutUint32(ev[0:], t.Events)
			binary.LittleEndian.PutUint64(ev[4:], t.Data)
			at := r.area + pageSize
			if err := r.child.WriteMem(at, ev); err != nil {
				return err
			}
			if _, err := r.call(unix.SYS_EPOLL_CTL, uint64(f.FD), unix.EPOLL_CTL_ADD, uint64(t.FD), at); err != nil {
				return fmt.Errorf("fd %d: epoll_ctl(ADD, %d, %#x): %w", f.FD, t.FD, t.Events, err)
			}
		}
	}
	// Restore the dumped limit (raised above for the move).
	for _, l := range r.st.Rlimits {
		if l.Resource == unix.RLIMIT_NOFILE {
			lim := unix.Rlimit{Cur: l.Cur, Max: l.Max}
			if err := unix.Prlimit(r.st.PID, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
				return fmt.Errorf("restore RLIMIT_NOFILE: %w", err)
			}
		}
	}
	return nil
}

func (r *restorer) dup3(from, to, flags int) error {
	if _, err := r.call(unix.SYS_DUP3, uint64(from), uint64(to), uint64(flags)); err != nil {
		return fmt.Errorf("dup3(%d, %d): %w", from, to, err)
	}
	return nil
}

// fdCreator creates the kernel objects behind descriptors; objects shared
// by several descriptors (pipe ends, socket pairs) are created once.
type fdCreator struct {
	r     *restorer
	pipes map[uint64][2]int // pipe id -> read, write end (ours)
	pairs map[uint64]int    // socket inode -> our end of a socketpair
	keep  []int             // fds kept until closeAll
}

// owned reports whether tmp is a one-off fd the caller closes.
func (fc *fdCreator) owned(tmp int) bool {
	for _, k := range fc.keep {
		if k == tmp {
			return false
		}
	}
	return true
}

func (fc *fdCreator) closeAll() {
	for _, k := range fc.keep {
		fc.r.closeFD(k)
	}
	fc.keep = nil
}

func (fc *fdCreator) create(f *image.FD) (int, error) {
	r := fc.r
	nonblock := uint64(0)
	if f.Flags&unix.O_NONBLOCK != 0 {
		nonblock = unix.O_NONBLOCK
	}
	switch f.Kind {
	case image.FDFile, image.FDDir, image.FDChr:
		fd, err := r.open(f.Path, f.Flags&^(unix.O_CREAT|unix.O_EXCL|unix.O_TRUNC|unix.O_NOCTTY)|unix.O_NOCTTY, 0)
		if err != nil {
			return -1, err
		}
		if f.Pos != 0 && f.Flags&unix.O_APPEND == 0 {
			if _, err := r.call(unix.SYS_LSEEK, uint64(fd), uint64(f.Pos), unix.SEEK_SET); err != nil {
				return -1, fmt.Errorf("lseek %s to %d: %w", f.Path, f.Pos, err)
			}
		}
		return fd, nil
	case image.FDFifo:
		return fc.fifo(f)
	case image.FDMemfd:
		if f.File == nil {
			return -1, fmt.Errorf("%w: memfd without identity", image.ErrCorrupt)
		}
		obj, ok := r.shmem[f.File.Ino]
		if !ok {
			return -1, fmt.Errorf("%w: memfd %s maps no restored object", image.ErrCorrupt, f.Path)
		}
		fd, err := r.call(unix.SYS_FCNTL, uint64(obj), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		if f.Pos != 0 {
			if _, err := r.call(unix.SYS_LSEEK, fd, uint64(f.Pos), unix.SEEK_SET); err != nil {
				return -1, err
			}
		}
		return int(fd), nil
	case image.FDPipe:
		return fc.pipe(f, nonblock)
	case image.FDEventfd:
		flags := nonblock
		if f.Eventfd.Semaphore {
			flags |= unix.EFD_SEMAPHORE
		}
		fd, err := r.call(unix.SYS_EVENTFD2, 0, flags)
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
		fd, err := r.call(unix.SYS_EPOLL_CREATE1, 0)
		if err != nil {
			return -1, fmt.Errorf("epoll_create1: %w", err)
		}
		return int(fd), nil
	case image.FDTimerfd:
		return fc.timerfd(f, nonblock)
	case image.FDSignalfd:
		at := r.area + pageSize
		if err := r.child.WriteMem(at, binary.LittleEndian.AppendUint64(nil, f.Signalfd.Mask)); err != nil {
			return -1, err
		}
		fd, err := r.call(unix.SYS_SIGNALFD4, ^uint64(0), at, 8, nonblock)
		if err != nil {
			return -1, fmt.Errorf("signalfd4: %w", err)
		}
		return int(fd), nil
	case image.FDSocket:
		return fc.socket(f, nonblock)
	}
	return -1, fmt.Errorf("%w: %s descriptors", ErrUnsupported, f.Kind)
}

// write writes b into fd of the process, through scratch.
func (fc *fdCreator) write(fd int, b []byte) error {
	at := fc.r.area + pageSize
	for len(b) > 0 {
		n := min(len(b), scratchLen)
		if err := fc.r.child.WriteMem(at, b[:n]); err != nil {
			return err
		}
		w, err := fc.r.call(unix.SYS_WRITE, uint64(fd), at, uint64(n))
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
func (fc *fdCreator) fifo(f *image.FD) (int, error) {
	r := fc.r
	acc := f.Flags & unix.O_ACCMODE
	flags := f.Flags &^ (unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC)
	holder := -1
	if acc == unix.O_WRONLY {
		var err error
		if holder, err = r.open(f.Path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err != nil {
			return -1, err
		}
		defer r.closeFD(holder)
	}
	fd, err := r.open(f.Path, flags|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, err
	}
	if f.Flags&unix.O_NONBLOCK == 0 {
		if _, err := r.call(unix.SYS_FCNTL, uint64(fd), unix.F_SETFL, uint64(flags&^unix.O_NONBLOCK)); err != nil {
			return -1, err
		}
	}
	return fd, nil
}

// pipe returns this end of the pipe, creating the pipe (with its buffered
// bytes) the first time one of its ends is met.
func (fc *fdCreator) pipe(f *image.FD, nonblock uint64) (int, error) {
	r := fc.r
	ends, ok := fc.pipes[f.Pipe.ID]
	if !ok {
		at := r.area + pageSize
		if _, err := r.call(unix.SYS_PIPE2, at, unix.O_CLOEXEC); err != nil {
			return -1, fmt.Errorf("pipe2: %w", err)
		}
		var b [8]byte
		if err := r.child.ReadMem(at, b[:]); err != nil {
			return -1, err
		}
		ends = [2]int{int(binary.LittleEndian.Uint32(b[0:])), int(binary.LittleEndian.Uint32(b[4:]))}
		fc.pipes[f.Pipe.ID] = ends
		fc.keep = append(fc.keep, ends[0], ends[1])
		// Find the dumped size and bytes, stored with one read end.
		for _, g := range r.st.FDs {
			if g.Pipe == nil || g.Pipe.ID != f.Pipe.ID || (g.Pipe.Size == 0 && len(g.Pipe.Buffered) == 0) {
				continue
			}
			if g.Pipe.Size > 0 {
				if _, err := r.call(unix.SYS_FCNTL, uint64(ends[1]), unix.F_SETPIPE_SZ, uint64(g.Pipe.Size)); err != nil {
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
	if _, err := r.call(unix.SYS_FCNTL, uint64(end), unix.F_SETFL, uint64(f.Flags&(unix.O_NONBLOCK|unix.O_DIRECT))); err != nil {
		return -1, fmt.Errorf("fcntl(F_SETFL): %w", err)
	}
	return end, nil
}

// tfdIocSetTicks is TFD_IOC_SET_TICKS, _IOW('T', 0, u64).
const tfdIocSetTicks = 0x40085400

func (fc *fdCreator) timerfd(f *image.FD, nonblock uint64) (int, error) {
	r := fc.r
	t := f.Timerfd
	fd, err := r.call(unix.SYS_TIMERFD_CREATE, uint64(t.Clock), nonblock)
	if err != nil {
		return -1, fmt.Errorf("timerfd_create(%d): %w", t.Clock, err)
	}
	if t.ValueNs != 0 || t.IntervalNs != 0 {
		// fdinfo gives the time remaining: set it relative.
		its := make([]byte, 32)
		le := binary.LittleEndian
		le.PutUint64(its[0:], uint64(t.IntervalNs/1e9))
		le.PutUint64(its[8:], uint64(t.IntervalNs%1e9))
		le.PutUint64(its[16:], uint64(t.ValueNs/1e9))
		le.PutUint64(its[24:], uint64(t.ValueNs%1e9))
		at := r.area + pageSize
		if err := r.child.WriteMem(at, its); err != nil {
			return -1, err
		}
		if _, err := r.call(unix.SYS_TIMERFD_SETTIME, fd, 0, at, 0); err != nil {
			return -1, fmt.Errorf("timerfd_settime: %w", err)
		}
	}
	if t.Ticks > 0 {
		at := r.area + pageSize
		if err := r.child.WriteMem(at, binary.LittleEndian.AppendUint64(nil, t.Ticks)); err != nil {
			return -1, err
		}
		if _, err := r.call(unix.SYS_IOCTL, fd, tfdIocSetTicks, at); err != nil {
			return -1, fmt.Errorf("timerfd: set %d pending ticks: %w", t.Ticks, err)
		}
	}
	return int(fd), nil
}

// socket recreates a socket in its state: listening and bound sockets
// are bound (and listen) again at their address, socket pairs are paired
// again; an established TCP connection cannot follow the process, so it
// comes back as a closed socket (its peer saw the reset at the dump), on
// which the program sees an error and closes it.
func (fc *fdCreator) socket(f *image.FD, nonblock uint64) (int, error) {
	r := fc.r
	s := f.Socket
	typ := uint64(s.Type) | unix.SOCK_CLOEXEC
	if nonblock != 0 {
		typ |= unix.SOCK_NONBLOCK
	}
	if s.Family == unix.AF_UNIX && s.State == "connected" {
		return fc.socketPair(f, typ)
	}
	fd, err := r.call(unix.SYS_SOCKET, uint64(s.Family), typ, uint64(s.Protocol))
	if err != nil {
		return -1, fmt.Errorf("socket(%d, %d, %d): %w", s.Family, s.Type, s.Protocol, err)
	}
	if err := fc.sockOpts(int(fd), s); err != nil {
		return -1, err
	}
	switch s.State {
	case "listen", "bound", "connected":
		if s.Local != "" {
			if err := fc.bind(int(fd), s); err != nil {
				return -1, err
			}
		}
	}
	switch s.State {
	case "listen":
		backlog := s.Backlog
		if backlog <= 0 {
			backlog = unix.SOMAXCONN
		}
		if _, err := r.call(unix.SYS_LISTEN, fd, uint64(backlog)); err != nil {
			return -1, fmt.Errorf("listen(%s, %d): %w", s.Local, backlog, err)
		}
	case "connected":
		if s.Family != unix.AF_UNIX && s.Peer != "" {
			at, n, err := fc.sockaddr(s.Family, s.Peer)
			if err != nil {
				return -1, err
			}
			if _, err := r.call(unix.SYS_CONNECT, fd, at, n); err != nil {
				return -1, fmt.Errorf("connect %s: %w", s.Peer, err)
			}
		}
	case "bound", "unbound":
	default:
		// established TCP and other connection states: closed socket
		r.log.Info("connection closed by restore", "fd", f.FD, "local", s.Local, "peer", s.Peer, "state", s.State)
	}
	return int(fd), nil
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
		at := fc.r.area + pageSize
		if err := fc.r.child.WriteMem(at, binary.LittleEndian.AppendUint32(nil, uint32(v))); err != nil {
			return err
		}
		if _, err := fc.r.call(unix.SYS_SETSOCKOPT, uint64(fd), uint64(o.level), uint64(o.opt), at, 4); err != nil {
			return fmt.Errorf("setsockopt %s=%d: %w", name, v, err)
		}
	}
	return nil
}

// bind binds fd to the socket's local address; a unix socket's stale
// file is removed first, as a server starting up would.
func (fc *fdCreator) bind(fd int, s *image.Socket) error {
	if s.Family == unix.AF_UNIX && !strings.HasPrefix(s.Local, "@") {
		a, err := fc.r.putString(0, s.Local)
		if err != nil {
			return err
		}
		fc.r.in.Syscall(unix.SYS_UNLINKAT, atFDCWD, a, 0) // ENOENT is fine
	}
	at, n, err := fc.sockaddr(s.Family, s.Local)
	if err != nil {
		return err
	}
	if _, err := fc.r.call(unix.SYS_BIND, uint64(fd), at, n); err != nil {
		return fmt.Errorf("bind %s: %w", s.Local, err)
	}
	return nil
}

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
		return 0, 0, fmt.Errorf("%w: address family %d", ErrUnsupported, family)
	}
	at := fc.r.area + pageSize + 1024
	if err := fc.r.child.WriteMem(at, b); err != nil {
		return 0, 0, err
	}
	return at, uint64(len(b)), nil
}

// socketPair returns this end of a unix socket pair whose both ends are
// in the process.
func (fc *fdCreator) socketPair(f *image.FD, typ uint64) (int, error) {
	r := fc.r
	s := f.Socket
	if end, ok := fc.pairs[s.ID]; ok {
		return end, nil
	}
	at := r.area + pageSize
	if _, err := r.call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, typ, 0, at); err != nil {
		return -1, fmt.Errorf("socketpair: %w", err)
	}
	var b [8]byte
	if err := r.child.ReadMem(at, b[:]); err != nil {
		return -1, err
	}
	a, c := int(binary.LittleEndian.Uint32(b[0:])), int(binary.LittleEndian.Uint32(b[4:]))
	peer := uint64(s.Options["peer_inode"])
	fc.pairs[s.ID] = a
	fc.pairs[peer] = c
	fc.keep = append(fc.keep, a, c)
	if err := fc.sockOpts(a, s); err != nil {
		return -1, err
	}
	return a, nil
}
