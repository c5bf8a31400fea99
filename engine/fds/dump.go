package fds

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
)

// Dump describes every open file descriptor of the frozen process pid,
// whose memory mappings are maps, or refuses the first one the snapshot
// format cannot describe, naming it.
func Dump(pid int, maps []proc.Mapping, log *slog.Logger) ([]image.FD, error) {
	fds, err := proc.ReadFDs(pid)
	if err != nil {
		return nil, err
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open: %w", err)
	}
	defer unix.Close(pidfd)
	fx := &fdDumper{pid: pid, maps: maps, log: log, pidfd: pidfd, all: fds, pipes: map[uint64]*pipeEnds{}}
	for _, p := range proc.GroupPipes(fds) {
		fx.pipes[p.Ino] = &pipeEnds{readers: p.Readers, writers: p.Writers}
	}
	var out []image.FD
	shared := fx.sharedFiles()
	for i := range fds {
		f, err := fx.fd(&fds[i])
		if err != nil {
			return nil, fmt.Errorf("fd %d (%s): %w", fds[i].Num, fds[i].Target, err)
		}
		if first, ok := shared[fds[i].Num]; ok {
			f.SameAs = &first
		}
		out = append(out, f)
	}
	return out, nil
}

// sharedFiles maps each descriptor that shares its open file description
// with a lower-numbered one (dup, dup2, fork-inherited, SCM_RIGHTS) to the
// lowest such number. Only descriptors on the same inode with the same
// flags can share one; kcmp(KCMP_FILE) tells whether they do.
func (fx *fdDumper) sharedFiles() map[int]int {
	type key struct {
		dev, ino uint64
		flags    uint32
	}
	groups := map[key][]int{}
	for i := range fx.all {
		f := &fx.all[i]
		if f.Info == nil {
			continue
		}
		k := key{f.Stat.Dev, f.Stat.Ino, f.Info.Flags &^ unix.O_CLOEXEC}
		groups[k] = append(groups[k], f.Num)
	}
	out := map[int]int{}
	for _, nums := range groups {
		for i := 1; i < len(nums); i++ {
			for _, first := range nums[:i] {
				if _, dup := out[first]; dup {
					continue // compare with the first of each group only
				}
				if sameFile(fx.pid, first, nums[i]) {
					out[nums[i]] = first
					break
				}
			}
		}
	}
	return out
}

// sameFile reports whether fds a and b of pid are the same open file.
func sameFile(pid, a, b int) bool {
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(pid), uintptr(pid), kcmpFile, uintptr(a), uintptr(b), 0)
	return errno == 0 && r == 0
}

// kcmpFile is KCMP_FILE (linux/kcmp.h).
const kcmpFile = 0

type pipeEnds struct {
	readers, writers []int
	buffered         []byte
	read             bool
}

type fdDumper struct {
	pid     int
	maps    []proc.Mapping
	log     *slog.Logger
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
	case proc.FDMemfd:
		out.Kind = image.FDMemfd
		out.Path = f.Path
		out.Pos = f.Info.Pos
		id := FileIdentity(f.Path, f.Stat)
		out.File = &id
		if !fx.mapped(f.Stat.Ino) {
			return out, fmt.Errorf("%w: memfd %s is not mapped, so its contents are not dumped", image.ErrUnsupported, f.Path)
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
				return out, fmt.Errorf("%w: epoll watches fd %d (inode %d), which is no longer open under that number", image.ErrUnsupported, t.TFD, t.Ino)
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
		return out, fmt.Errorf("%w: %s file descriptors cannot be dumped yet", image.ErrUnsupported, f.Kind)
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
	for i := range fx.maps {
		if m := &fx.maps[i]; m.IsShmem() && m.Inode == ino {
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
		return out, fmt.Errorf("%w: pipe:[%d] has an end outside the process (restore could not reconnect it)", image.ErrUnsupported, f.Ino)
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
			return out, fmt.Errorf("%w: inet socket of type %d", image.ErrUnsupported, sk.Type)
		}
		if err := fx.inetState(sk, accepting != 0); err != nil {
			return out, err
		}
	case unix.AF_UNIX:
		if err := fx.unixState(f, s, sk, accepting != 0); err != nil {
			return out, err
		}
	default:
		return out, fmt.Errorf("%w: socket family %d", image.ErrUnsupported, sk.Family)
	}
	if sk.State != sockListen && sk.Queued == nil {
		if n, err := unix.IoctlGetInt(s, unix.SIOCINQ); err == nil && n > 0 {
			fx.log.Warn("data queued in a socket is not kept", "fd", f.Num, "bytes", n, "local", sk.Local, "peer", sk.Peer, "state", sk.State)
		}
	}
	out.Socket = sk
	return out, nil
}

// Socket states as image.Socket records them.
const (
	sockListen      = "listen"
	sockEstablished = "established" // a connection: closed at restore
	sockConnected   = "connected"   // connected again (or re-paired) at restore
	sockBound       = "bound"
	sockUnbound     = "unbound"
	// peerInodeOption, in image.Socket.Options, is the inode of the other
	// end of a unix socket pair held by the process.
	peerInodeOption = "peer_inode"
)

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

// inetState fills the state and backlog of a TCP or UDP socket. A TCP
// socket in any connection state (established, or on its way in or out)
// is a connection: restore brings it back closed.
func (fx *fdDumper) inetState(sk *image.Socket, listening bool) error {
	if fx.inet == nil {
		fx.inet = map[uint64]proc.InetDiag{}
		for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
			for _, pr := range []int{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
				ds, err := proc.QueryInet(fx.pid, fam, pr)
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
		sk.State = sockListen
		if ok {
			sk.Backlog = int(diag.WQueue) // max backlog of a listener
		}
	case sk.Type == unix.SOCK_STREAM && ok && diag.State != proc.TCPClose:
		sk.State = sockEstablished
		if diag.State != proc.TCPEstablished {
			sk.State = fmt.Sprintf("tcp-state-%d", diag.State)
		}
	case sk.Type == unix.SOCK_STREAM && sk.Peer != "":
		sk.State = sockEstablished
	case sk.Peer != "":
		sk.State = sockConnected
	case sk.Local != "" && !isUnspecifiedPortZero(sk.Local):
		sk.State = sockBound
	default:
		sk.State = sockUnbound
	}
	return nil
}

func isUnspecifiedPortZero(s string) bool {
	ap, err := netip.ParseAddrPort(s)
	return err == nil && ap.Port() == 0 && ap.Addr().IsUnspecified()
}

// unixState fills the state of a unix socket: listening, bound, one end of
// a pair whose other end is in the process (with the data queued to it),
// a datagram socket connected to a named peer, in the process or outside
// (connected again at restore), or a stream connection to a peer outside
// (closed at restore, like an established TCP connection).
func (fx *fdDumper) unixState(f *proc.FD, s int, sk *image.Socket, listening bool) error {
	if fx.unixd == nil {
		ds, err := proc.QueryUnix(fx.pid)
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
		sk.State = sockListen
		sk.Backlog = int(diag.WQueue)
	case diag.Peer != 0 && fx.hasSocket(diag.Peer) && fx.unixd[diag.Peer].Peer == sk.ID &&
		diag.Path == "" && fx.unixd[diag.Peer].Path == "":
		// Two unnamed sockets connected to each other: a socket pair
		// (or an accepted connection, the same to restore).
		sk.State = sockConnected
		sk.Options[peerInodeOption] = int(diag.Peer)
		q, err := peekQueue(s, sk.Type)
		if err != nil {
			return fmt.Errorf("read queued data: %w", err)
		}
		sk.Queued = q
	case diag.Peer != 0 && sk.Type != unix.SOCK_STREAM && sk.Type != unix.SOCK_SEQPACKET && sk.Peer != "" && sk.Peer != "@":
		sk.State = sockConnected
	case diag.Peer != 0 || sk.Peer != "":
		sk.State = sockEstablished
	case sk.Local != "" && sk.Local != "@":
		sk.State = sockBound
	default:
		sk.State = sockUnbound
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

// maxQueued bounds the data read from one socket's receive queue.
const maxQueued = 64 << 20

// peekQueue copies the receive queue of a unix socket without consuming
// it: MSG_PEEK with SO_PEEK_OFF, so each peek reads past the previous one
// (one message at a time for datagrams). The process's own peek offset is
// put back. File descriptors in flight (SCM_RIGHTS) are refused: they
// cannot be described.
func peekQueue(s, typ int) ([][]byte, error) {
	inq, err := unix.IoctlGetInt(s, unix.SIOCINQ)
	if err != nil {
		return nil, fmt.Errorf("SIOCINQ: %w", err)
	}
	if inq == 0 {
		return nil, nil
	}
	old, err := unix.GetsockoptInt(s, unix.SOL_SOCKET, unix.SO_PEEK_OFF)
	if err != nil {
		return nil, fmt.Errorf("SO_PEEK_OFF: %w", err)
	}
	if err := unix.SetsockoptInt(s, unix.SOL_SOCKET, unix.SO_PEEK_OFF, 0); err != nil {
		return nil, fmt.Errorf("SO_PEEK_OFF: %w", err)
	}
	defer unix.SetsockoptInt(s, unix.SOL_SOCKET, unix.SO_PEEK_OFF, old)
	var out [][]byte
	var stream []byte
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(64*4))
	total := 0
	peekFlags := unix.MSG_PEEK | unix.MSG_DONTWAIT
	if typ != unix.SOCK_STREAM {
		peekFlags |= unix.MSG_TRUNC // the whole length of a message
	}
	for {
		n, oobn, flags, _, err := unix.Recvmsg(s, buf, oob, peekFlags)
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("peek: %w", err)
		}
		if oobn > 0 {
			if err := refuseRights(oob[:oobn]); err != nil {
				return nil, err
			}
		}
		if flags&unix.MSG_CTRUNC != 0 {
			return nil, fmt.Errorf("%w: unix socket has file descriptors in flight", image.ErrUnsupported)
		}
		if n > len(buf) {
			// A message larger than the buffer: peek it again whole.
			if n > maxQueued {
				return nil, fmt.Errorf("%w: queued message of %d bytes", image.ErrUnsupported, n)
			}
			buf = make([]byte, n)
			unix.SetsockoptInt(s, unix.SOL_SOCKET, unix.SO_PEEK_OFF, total)
			continue
		}
		if n == 0 && typ == unix.SOCK_STREAM {
			break // the peer shut down
		}
		total += n
		if total > maxQueued {
			return nil, fmt.Errorf("%w: more than %d bytes queued", image.ErrUnsupported, maxQueued)
		}
		if typ == unix.SOCK_STREAM {
			stream = append(stream, buf[:n]...)
			continue
		}
		out = append(out, append([]byte(nil), buf[:n]...))
	}
	if typ == unix.SOCK_STREAM && len(stream) > 0 {
		out = [][]byte{stream}
	}
	return out, nil
}

// refuseRights closes the descriptors a peek received and refuses them.
func refuseRights(oob []byte) error {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return fmt.Errorf("control message: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			continue
		}
		fds, _ := unix.ParseUnixRights(&m)
		for _, fd := range fds {
			unix.Close(fd)
		}
		return fmt.Errorf("%w: unix socket has file descriptors in flight", image.ErrUnsupported)
	}
	return nil
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

// ResetConnections sets SO_LINGER {on, 0 s} on every TCP connection of
// the process, which is about to be killed: its close then sends a reset
// and leaves no TIME_WAIT or FIN_WAIT socket behind. Those would hold the
// ports of its listeners, and a listener without SO_REUSEADDR could not
// be bound again by the restore until they expire. The peers see their
// connection reset, as restore --tcp-close has it. Failures are only
// logged: the snapshot is written already.
func ResetConnections(st *image.Process, log *slog.Logger) {
	pidfd := -1
	defer func() {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
	}()
	for _, f := range st.FDs {
		s := f.Socket
		if s == nil || f.SameAs != nil || s.Type != unix.SOCK_STREAM ||
			(s.Family != unix.AF_INET && s.Family != unix.AF_INET6) || !isConnection(s.State) {
			continue
		}
		if pidfd < 0 {
			var err error
			if pidfd, err = unix.PidfdOpen(st.PID, 0); err != nil {
				log.Warn("connections not reset", "pid", st.PID, "err", err)
				return
			}
		}
		fd, err := unix.PidfdGetfd(pidfd, f.FD, 0)
		if err == nil {
			err = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
			unix.Close(fd)
		}
		if err != nil {
			log.Warn("connection not reset", "fd", f.FD, "local", s.Local, "peer", s.Peer, "err", err)
		}
	}
}

// FileIdentity is the identity of the file at path that the snapshot
// records, from what /proc said of it.
func FileIdentity(path string, id proc.FileID) image.FileID {
	return image.FileID{Path: path, Dev: id.Dev, Ino: id.Ino, Size: id.Size, MtimeNs: id.Mtime.UnixNano(), Mode: id.Mode}
}
