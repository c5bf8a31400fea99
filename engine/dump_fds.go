package engine

import (
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
)

// fds describes every open file descriptor, or refuses the first one the
// snapshot format cannot describe, naming it.
func (d *dumper) fds() ([]image.FD, error) {
	fds, err := proc.ReadFDs(d.pid)
	if err != nil {
		return nil, err
	}
	pidfd, err := unix.PidfdOpen(d.pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open: %w", err)
	}
	defer unix.Close(pidfd)
	fx := &fdDumper{d: d, pidfd: pidfd, all: fds, pipes: map[uint64]*pipeEnds{}}
	for _, p := range proc.GroupPipes(fds) {
		fx.pipes[p.Ino] = &pipeEnds{readers: p.Readers, writers: p.Writers}
	}
	var out []image.FD
	for i := range fds {
		f, err := fx.fd(&fds[i])
		if err != nil {
			return nil, fmt.Errorf("fd %d (%s): %w", fds[i].Num, fds[i].Target, err)
		}
		out = append(out, f)
	}
	return out, nil
}

type pipeEnds struct {
	readers, writers []int
	buffered         []byte
	read             bool
}

type fdDumper struct {
	d       *dumper
	pidfd   int
	all     []proc.FD
	pipes   map[uint64]*pipeEnds
	sockets proc.Sockets
	inet    map[uint64]proc.InetDiag
	unixd   map[uint64]proc.UnixDiag
}

func (fx *fdDumper) fd(f *proc.FD) (image.FD, error) {
	out := image.FD{FD: f.Num}
	if f.Info == nil {
		return out, fmt.Errorf("no fdinfo")
	}
	flags := int(f.Info.Flags)
	out.CloExec = flags&unix.O_CLOEXEC != 0
	out.Flags = flags &^ unix.O_CLOEXEC
	switch f.Kind {
	case proc.FDFile, proc.FDDir, proc.FDCharDev, proc.FDFIFO:
		if f.Deleted {
			return out, fmt.Errorf("%w: open file %s was deleted", ErrUnsupported, f.Path)
		}
		out.Kind = map[proc.FDKind]string{proc.FDFile: image.FDFile, proc.FDDir: image.FDDir, proc.FDCharDev: image.FDChr, proc.FDFIFO: image.FDFifo}[f.Kind]
		out.Path = f.Path
		out.Pos = f.Info.Pos
		id := fileID(f.Path, f.Stat)
		out.File = &id
		if f.Kind == proc.FDCharDev {
			out.Rdev = f.Stat.Rdev
		}
	case proc.FDMemfd:
		out.Kind = image.FDMemfd
		out.Path = f.Path
		out.Pos = f.Info.Pos
		id := fileID(f.Path, f.Stat)
		out.File = &id
		if !fx.mapped(f.Stat.Ino) {
			return out, fmt.Errorf("%w: memfd %s is not mapped, so its contents are not dumped", ErrUnsupported, f.Path)
		}
	case proc.FDPipe:
		return fx.pipe(f, out)
	case proc.FDEventfd:
		e := f.Info.Eventfd
		if e == nil {
			return out, fmt.Errorf("eventfd without eventfd-count in fdinfo")
		}
		out.Kind = image.FDEventfd
		out.Eventfd = &image.Eventfd{Count: e.Count, Semaphore: e.Semaphore}
	case proc.FDEpoll:
		out.Kind = image.FDEpoll
		out.Epoll = &image.Epoll{Targets: []image.EpollTarget{}}
		for _, t := range f.Info.Epoll {
			if !fx.open(t.TFD, t.Ino) {
				return out, fmt.Errorf("%w: epoll watches fd %d (inode %d), which is no longer open under that number", ErrUnsupported, t.TFD, t.Ino)
			}
			out.Epoll.Targets = append(out.Epoll.Targets, image.EpollTarget{FD: t.TFD, Events: t.Events, Data: t.Data})
		}
	case proc.FDTimerfd:
		t := f.Info.Timerfd
		if t == nil {
			return out, fmt.Errorf("timerfd without clockid in fdinfo")
		}
		out.Kind = image.FDTimerfd
		out.Timerfd = &image.Timerfd{Clock: t.ClockID, Flags: t.SettimeFlags, Ticks: t.Ticks,
			ValueNs: int64(t.Value.Sec*1e9 + t.Value.Nsec), IntervalNs: int64(t.Interval.Sec*1e9 + t.Interval.Nsec)}
	case proc.FDSignalfd:
		if f.Info.Signalfd == nil {
			return out, fmt.Errorf("signalfd without sigmask in fdinfo")
		}
		out.Kind = image.FDSignalfd
		out.Signalfd = &image.Signalfd{Mask: f.Info.Signalfd.Mask}
	case proc.FDSocket:
		return fx.socket(f, out)
	default:
		return out, fmt.Errorf("%w: %s file descriptors cannot be dumped yet", ErrUnsupported, f.Kind)
	}
	return out, nil
}

// open reports whether fd num is open on inode ino.
func (fx *fdDumper) open(num int, ino uint64) bool {
	for _, f := range fx.all {
		if f.Num == num {
			return f.Stat.Ino == ino || f.Ino == ino
		}
	}
	return false
}

// mapped reports whether a shared mapping of inode ino exists.
func (fx *fdDumper) mapped(ino uint64) bool {
	for i := range fx.d.maps {
		if m := &fx.d.maps[i]; m.IsShmem() && m.Inode == ino {
			return true
		}
	}
	return false
}

// pipe records one end of a pipe. Both ends must be in the process; the
// bytes buffered in it are stored with its lowest read end.
func (fx *fdDumper) pipe(f *proc.FD, out image.FD) (image.FD, error) {
	ends := fx.pipes[f.Ino]
	if ends == nil || len(ends.readers) == 0 || len(ends.writers) == 0 {
		return out, fmt.Errorf("%w: pipe:[%d] has an end outside the process (restore could not reconnect it)", ErrUnsupported, f.Ino)
	}
	out.Kind = image.FDPipe
	out.Pipe = &image.Pipe{ID: f.Ino}
	if f.Num == ends.readers[0] {
		if !ends.read {
			b, size, err := fx.peekPipe(f.Num)
			if err != nil {
				return out, fmt.Errorf("read buffered bytes: %w", err)
			}
			ends.buffered, ends.read = b, true
			out.Pipe.Size = size
		}
		out.Pipe.Buffered = ends.buffered
	}
	return out, nil
}

// peekPipe copies the bytes buffered in a pipe of the process without
// consuming them: tee(2) duplicates them into a pipe of our own.
func (fx *fdDumper) peekPipe(num int) ([]byte, int, error) {
	src, err := unix.PidfdGetfd(fx.pidfd, num, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("pidfd_getfd: %w", err)
	}
	defer unix.Close(src)
	size, err := unix.FcntlInt(uintptr(src), unix.F_GETPIPE_SZ, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("F_GETPIPE_SZ: %w", err)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, 0, err
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if _, err := unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, size); err != nil {
		return nil, 0, fmt.Errorf("F_SETPIPE_SZ %d: %w", size, err)
	}
	n, err := unix.Tee(src, p[1], size, unix.SPLICE_F_NONBLOCK)
	if errors.Is(err, unix.EAGAIN) {
		return nil, size, nil // empty
	}
	if err != nil {
		return nil, 0, fmt.Errorf("tee: %w", err)
	}
	buf := make([]byte, n)
	if _, err := unix.Read(p[0], buf); err != nil {
		return nil, 0, err
	}
	return buf, size, nil
}

// socket records a socket: family, type, protocol, state, addresses,
// backlog and the options restore sets.
func (fx *fdDumper) socket(f *proc.FD, out image.FD) (image.FD, error) {
	out.Kind = image.FDSocket
	s, err := unix.PidfdGetfd(fx.pidfd, f.Num, 0)
	if err != nil {
		return out, fmt.Errorf("pidfd_getfd: %w", err)
	}
	defer unix.Close(s)
	sk := &image.Socket{ID: f.Ino, Options: map[string]int{}}
	if sk.Family, err = unix.GetsockoptInt(s, unix.SOL_SOCKET, unix.SO_DOMAIN); err != nil {
		return out, err
	}
	if sk.Type, err = unix.GetsockoptInt(s, unix.SOL_SOCKET, unix.SO_TYPE); err != nil {
		return out, err
	}
	if sk.Protocol, err = unix.GetsockoptInt(s, unix.SOL_SOCKET, unix.SO_PROTOCOL); err != nil {
		return out, err
	}
	accepting, _ := unix.GetsockoptInt(s, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if la, err := unix.Getsockname(s); err == nil {
		sk.Local = sockaddrString(la)
	}
	if pa, err := unix.Getpeername(s); err == nil {
		sk.Peer = sockaddrString(pa)
	}
	for name, o := range sockOptions(sk.Family, sk.Type) {
		if v, err := unix.GetsockoptInt(s, o.level, o.opt); err == nil {
			sk.Options[name] = v
		}
	}
	switch sk.Family {
	case unix.AF_INET, unix.AF_INET6:
		if sk.Type != unix.SOCK_STREAM && sk.Type != unix.SOCK_DGRAM {
			return out, fmt.Errorf("%w: inet socket of type %d", ErrUnsupported, sk.Type)
		}
		if err := fx.inetState(sk, accepting != 0); err != nil {
			return out, err
		}
	case unix.AF_UNIX:
		if err := fx.unixState(f, sk, accepting != 0); err != nil {
			return out, err
		}
	default:
		return out, fmt.Errorf("%w: socket family %d", ErrUnsupported, sk.Family)
	}
	out.Socket = sk
	return out, nil
}

type sockOpt struct{ level, opt int }

// sockOptions lists the options a socket of the family and type gets back.
func sockOptions(family, typ int) map[string]sockOpt {
	o := map[string]sockOpt{
		"SO_REUSEADDR": {unix.SOL_SOCKET, unix.SO_REUSEADDR},
		"SO_REUSEPORT": {unix.SOL_SOCKET, unix.SO_REUSEPORT},
		"SO_KEEPALIVE": {unix.SOL_SOCKET, unix.SO_KEEPALIVE},
		"SO_BROADCAST": {unix.SOL_SOCKET, unix.SO_BROADCAST},
		"SO_PASSCRED":  {unix.SOL_SOCKET, unix.SO_PASSCRED},
		"SO_RCVLOWAT":  {unix.SOL_SOCKET, unix.SO_RCVLOWAT},
	}
	if family == unix.AF_INET || family == unix.AF_INET6 {
		if typ == unix.SOCK_STREAM {
			o["TCP_NODELAY"] = sockOpt{unix.IPPROTO_TCP, unix.TCP_NODELAY}
			o["TCP_DEFER_ACCEPT"] = sockOpt{unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT}
			o["TCP_KEEPIDLE"] = sockOpt{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE}
			o["TCP_KEEPINTVL"] = sockOpt{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL}
			o["TCP_KEEPCNT"] = sockOpt{unix.IPPROTO_TCP, unix.TCP_KEEPCNT}
			o["TCP_FASTOPEN"] = sockOpt{unix.IPPROTO_TCP, unix.TCP_FASTOPEN}
		}
		if family == unix.AF_INET6 {
			o["IPV6_V6ONLY"] = sockOpt{unix.IPPROTO_IPV6, unix.IPV6_V6ONLY}
		}
	}
	return o
}

// inetState fills the state and backlog of a TCP or UDP socket.
func (fx *fdDumper) inetState(sk *image.Socket, listening bool) error {
	if fx.inet == nil {
		fx.inet = map[uint64]proc.InetDiag{}
		for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
			for _, pr := range []int{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
				ds, err := proc.QueryInet(fx.d.pid, fam, pr)
				if err != nil {
					return fmt.Errorf("sock_diag: %w", err)
				}
				for _, x := range ds {
					fx.inet[x.Inode] = x
				}
			}
		}
	}
	diag, ok := fx.inet[sk.ID]
	switch {
	case listening:
		sk.State = "listen"
		if ok {
			sk.Backlog = int(diag.WQueue) // max backlog of a listener
		}
	case sk.Type == unix.SOCK_STREAM && sk.Peer != "":
		sk.State = "established"
		if ok && diag.State != proc.TCPEstablished {
			sk.State = fmt.Sprintf("tcp-state-%d", diag.State)
		}
	case sk.Peer != "":
		sk.State = "connected"
	case sk.Local != "" && !isUnspecifiedPortZero(sk.Local):
		sk.State = "bound"
	default:
		sk.State = "unbound"
	}
	return nil
}

func isUnspecifiedPortZero(s string) bool {
	ap, err := netip.ParseAddrPort(s)
	return err == nil && ap.Port() == 0 && ap.Addr().IsUnspecified()
}

// unixState fills the state of a unix socket: bound, listening, or one
// end of a pair whose other end is in the process.
func (fx *fdDumper) unixState(f *proc.FD, sk *image.Socket, listening bool) error {
	if fx.unixd == nil {
		ds, err := proc.QueryUnix(fx.d.pid)
		if err != nil {
			return fmt.Errorf("sock_diag: %w", err)
		}
		fx.unixd = map[uint64]proc.UnixDiag{}
		for _, x := range ds {
			fx.unixd[x.Inode] = x
		}
	}
	diag := fx.unixd[sk.ID]
	switch {
	case listening:
		sk.State = "listen"
		sk.Backlog = int(diag.WQueue)
	case diag.Peer != 0:
		if !fx.hasSocket(diag.Peer) {
			return fmt.Errorf("%w: unix socket connected to a peer outside the process", ErrUnsupported)
		}
		sk.State = "connected"
		sk.Options["peer_inode"] = int(diag.Peer)
	case sk.Local != "" && sk.Local != "@":
		sk.State = "bound"
	default:
		sk.State = "unbound"
	}
	return nil
}

func (fx *fdDumper) hasSocket(ino uint64) bool {
	for _, f := range fx.all {
		if f.Kind == proc.FDSocket && f.Ino == ino {
			return true
		}
	}
	return false
}

// sockaddrString formats a socket address as restore parses it.
func sockaddrString(sa unix.Sockaddr) string {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)).String()
	case *unix.SockaddrUnix:
		if a.Name == "" {
			return ""
		}
		if a.Name[0] == 0 {
			return "@" + a.Name[1:]
		}
		return a.Name
	}
	return ""
}
