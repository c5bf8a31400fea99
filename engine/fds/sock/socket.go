package sock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/proc/sockdiag"
)

// Dumper describes the sockets of one process (of a tree, or alone).
type Dumper struct {
	PID   int
	PIDFD int // a pidfd of the process: copies of its sockets are taken through it
	Log   *slog.Logger
	FDs   []proc.FD // every descriptor of the process
	// TreeSockets are the socket inodes held in the process's tree; nil
	// for a single process.
	TreeSockets map[uint64]bool
	// TCP, if set, takes established TCP connections with TCP_REPAIR
	// under its lock; otherwise they are recorded to be closed at
	// restore.
	TCP *TCPRepair
	// Outside records f, a unix stream socket connected outside, as
	// leading outside by key if --external names it (out.External set).
	Outside func(f *proc.FD, out *image.FD, key string)

	inet  map[uint64]sockdiag.InetDiag // from sock_diag, once asked
	unixd map[uint64]sockdiag.UnixDiag
}

// Injector runs system calls in the process under restore and passes
// their arguments through its scratch memory: what a socket's restore
// asks of a *syscalls.Injector.
type Injector interface {
	Call(nr int, args ...uint64) (uint64, error)
	Syscall(nr int, args ...uint64) (int64, error)
	Put(off int, b []byte) (uint64, error)
	PutString(off int, s string) (uint64, error)
	Get(off int, b []byte) error
	Scratch() (addr uint64, n int)
	CloseFD(fd int) error
}

// Host is what a socket's restore asks of the restore of every
// descriptor around it (engine/fds).
type Host interface {
	// KeepPair moves the two descriptors a socketpair wrote at scratch
	// address at out of the way, keeps them until every descriptor is
	// in place, and returns them.
	KeepPair(at uint64) ([2]int, error)
	// SetFlags sets on fd the file status flags of f that F_SETFL sets.
	SetFlags(fd int, f *image.FD) error
	// Pidfd returns a pidfd of the process, opened once.
	Pidfd() (int, error)
}

// Restorer recreates the sockets of one process, each at the number the
// restore of descriptors asks (Socket), and connects its unix datagram
// sockets once every descriptor is in place (ConnectUnix). Its zero value
// with the fields set is ready.
type Restorer struct {
	In   Injector
	Host Host
	Proc *image.Process
	Log  *slog.Logger
	// TCPEstablished brings the connections the dump took with
	// TCP_REPAIR back connected; without it they come back closed.
	TCPEstablished bool
	// Foreign: the process lives in a mount namespace not snapctl's: a
	// stale socket file at a path it binds is not removed here.
	Foreign bool

	pairs map[uint64]int // socket inode -> its end of a socketpair (kept)
	inCwd bool           // the process is in its dumped working directory
	// connects are the unix datagram sockets to connect to their named
	// peer once every descriptor is in place.
	connects []*image.FD
}

// scratchLen is the size of the process's scratch memory.
func (r *Restorer) scratchLen() int {
	_, n := r.In.Scratch()
	return n
}

// closeFD closes fd in the process; a failure is only logged.
func (r *Restorer) closeFD(fd int) {
	if err := r.In.CloseFD(fd); err != nil {
		r.Log.Warn("close in restored process", "fd", fd, "err", err)
	}
}

// Socket records the socket f: family, type, protocol, state, addresses,
// backlog and the options restore sets.
func (d *Dumper) Socket(f *proc.FD, out image.FD) (image.FD, error) {
	out.Kind = image.FDSocket
	s, err := unix.PidfdGetfd(d.PIDFD, f.Num, 0)
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
		if err := d.inetState(sk, accepting != 0); err != nil {
			return out, err
		}
	case unix.AF_UNIX:
		if err := d.unixState(f, s, sk, accepting != 0); err != nil {
			return out, err
		}
	default:
		return out, fmt.Errorf("%w: %s socket", image.ErrUnsupported, familyName(sk.Family))
	}
	if d.TCP != nil && sk.State == sockEstablished && sk.Type == unix.SOCK_STREAM && sk.Family != unix.AF_UNIX {
		if err := d.tcpConn(f, sk); err != nil {
			return out, err
		}
	}
	if sk.Family == unix.AF_UNIX && sk.State == sockEstablished && d.Outside != nil {
		d.Outside(f, &out, fmt.Sprintf("socket:[%d]", f.Ino))
	}
	if isConnection(sk.State) && sk.TCP == nil && out.External == "" {
		how := "only established connections can be kept"
		switch {
		case sk.Family == unix.AF_UNIX:
			how = fmt.Sprintf("--external fd[%d] keeps it", f.Num)
		case sk.State == sockEstablished:
			how = "--tcp-established keeps it"
		}
		d.Log.Warn("connection will be closed at restore: "+how, "pid", d.PID, "fd", f.Num, "local", sk.Local, "peer", sk.Peer, "state", sk.State)
	}
	if sk.State != sockListen && sk.Queued == nil && sk.TCP == nil && out.External == "" {
		if n, err := unix.IoctlGetInt(s, unix.SIOCINQ); err == nil && n > 0 {
			d.Log.Warn("data queued in a socket is not kept", "fd", f.Num, "bytes", n, "local", sk.Local, "peer", sk.Peer, "state", sk.State)
		}
	}
	out.Socket = sk
	return out, nil
}

// Socket states as image.Socket records them.
const (
	sockListen      = "listen"
	sockEstablished = "established" // a connection: closed at restore
	// StateConnected: connected again (or re-paired) at restore.
	StateConnected = "connected"
	sockBound      = "bound"
	sockUnbound    = "unbound"
	// PeerInodeOption, in image.Socket.Options, is the inode of the other
	// end of a unix socket pair held by the process (or the tree).
	PeerInodeOption = "peer_inode"
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

// Socket recreates the socket of f in its state: listening and bound sockets are
// bound (and listen) again at their address with their options, socket
// pairs are paired again with the data that was queued in them, a
// datagram socket connected to an address is connected again. A
// connection (established TCP, or a unix stream connected to a process
// outside) comes back as a socket whose peer has closed, on which the
// program reads end-of-file (its peer saw the connection reset when the
// dumped process went away), unless the dump kept it: an established TCP
// connection taken with TCP_REPAIR comes back connected with
// --tcp-established (tcp.go), a descriptor leading outside is replaced
// (engine/fds, external.go).
//
// flags are O_NONBLOCK and O_CLOEXEC, the same bits as SOCK_NONBLOCK and
// SOCK_CLOEXEC.
func (r *Restorer) Socket(f *image.FD, flags uint64) (int, error) {
	s := f.Socket
	typ := uint64(s.Type) | flags&(unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
	if s.TCP != nil && r.TCPEstablished {
		return r.tcpConn(f, typ)
	}
	if s.Family == unix.AF_UNIX {
		if _, paired := s.Options[PeerInodeOption]; paired && s.State == StateConnected {
			return r.socketPair(f, typ)
		}
		if isConnection(s.State) {
			return r.closedUnix(f, typ)
		}
	}
	fd, err := r.In.Call(unix.SYS_SOCKET, uint64(s.Family), typ, uint64(s.Protocol))
	if err != nil {
		return -1, fmt.Errorf("socket(%d, %d, %d): %w", s.Family, s.Type, s.Protocol, err)
	}
	if isConnection(s.State) {
		// A fresh TCP socket whose receive side is shut down reads as a
		// connection the peer closed: read returns 0, poll reports
		// EPOLLIN|EPOLLRDHUP|EPOLLHUP. (shutdown sets the flag even as
		// it returns ENOTCONN for the unconnected socket.) Its options
		// are not set: the program is about to close it.
		r.In.Syscall(unix.SYS_SHUTDOWN, fd, unix.SHUT_RD)
		r.closedConn(f)
		return int(fd), nil
	}
	if err := r.SetOptions(int(fd), s); err != nil {
		return -1, err
	}
	switch s.State {
	case sockListen, sockBound:
		if s.Local != "" {
			if err := r.bind(int(fd), s); err != nil {
				return -1, err
			}
		}
	case StateConnected:
		// The local address of a connected datagram socket is most often
		// an ephemeral port: connect picks another if it is taken.
		if s.Local != "" && !(s.Family == unix.AF_UNIX && s.Local == "@") {
			if err := r.bind(int(fd), s); err != nil {
				r.Log.Warn("connected socket not bound to its address again", "fd", f.FD, "local", s.Local, "err", err)
			}
		}
	}
	switch {
	case s.State == sockListen:
		backlog := s.Backlog
		if backlog <= 0 {
			backlog = unix.SOMAXCONN
		}
		if _, err := r.In.Call(unix.SYS_LISTEN, fd, uint64(backlog)); err != nil {
			return -1, fmt.Errorf("listen(%s, %d): %w", s.Local, backlog, err)
		}
	case s.State == StateConnected && s.Peer != "" && s.Family == unix.AF_UNIX:
		// Its peer may be a socket of the process not bound yet.
		r.connects = append(r.connects, f)
	case s.State == StateConnected && s.Peer != "":
		at, n, err := r.sockaddr(s.Family, s.Peer)
		if err != nil {
			return -1, err
		}
		if _, err := r.In.Call(unix.SYS_CONNECT, fd, at, n); err != nil {
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

// SetOptions sets the recorded options of s on fd.
func (r *Restorer) SetOptions(fd int, s *image.Socket) error {
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
		if err := r.setInt(fd, o.level, o.opt, v); err != nil {
			return fmt.Errorf("setsockopt %s=%d: %w", name, v, err)
		}
	}
	return nil
}

// setInt sets an int socket option of fd in the process.
func (r *Restorer) setInt(fd, level, opt, v int) error {
	at, err := r.In.Put(0, binary.LittleEndian.AppendUint32(nil, uint32(v)))
	if err != nil {
		return err
	}
	_, err = r.In.Call(unix.SYS_SETSOCKOPT, uint64(fd), uint64(level), uint64(opt), at, 4)
	return err
}

// bind binds fd to the socket's local address; a unix socket's stale
// file is removed first, as a server starting up would, if it is a socket
// in a directory nobody else can change (removeStaleSocket). A relative
// unix path is taken from the process's working directory.
func (r *Restorer) bind(fd int, s *image.Socket) error {
	if s.Family == unix.AF_UNIX && !strings.HasPrefix(s.Local, "@") {
		if !strings.HasPrefix(s.Local, "/") && !r.inCwd {
			// The process state step sets the directory again later.
			a, err := r.In.PutString(0, r.Proc.Cwd)
			if err != nil {
				return err
			}
			if _, err := r.In.Call(unix.SYS_CHDIR, a); err != nil {
				return fmt.Errorf("chdir %s to bind %s: %w", r.Proc.Cwd, s.Local, err)
			}
			r.inCwd = true
		}
		path := s.Local
		if !filepath.IsAbs(path) {
			path = filepath.Join(r.Proc.Cwd, path)
		}
		if !r.Foreign {
			if err := removeStaleSocket(path, s.Type, r.Proc.Creds.UID[3]); err != nil {
				return err
			}
		}
	}
	at, n, err := r.sockaddr(s.Family, s.Local)
	if err != nil {
		return err
	}
	if _, err := r.In.Call(unix.SYS_BIND, uint64(fd), at, n); err != nil {
		if errors.Is(err, unix.EADDRINUSE) && s.Family != unix.AF_UNIX {
			hint := ""
			if s.Type == unix.SOCK_STREAM && s.Options["SO_REUSEADDR"] == 0 {
				hint = " (the socket has no SO_REUSEADDR: connections in TIME_WAIT on the port refuse it too, until they expire)"
			}
			err = fmt.Errorf("%w: another socket holds it now: stop what holds it, or restore into a network namespace of its own (--netns new)%s", err, hint)
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
func (r *Restorer) sockaddr(family int, addr string) (uint64, uint64, error) {
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
	at, err := r.In.Put(sockaddrOff, b)
	if err != nil {
		return 0, 0, err
	}
	return at, uint64(len(b)), nil
}

// familyName names a socket family that is neither inet nor unix, for a
// refusal.
func familyName(family int) string {
	if name, ok := map[int]string{
		unix.AF_NETLINK: "netlink", unix.AF_PACKET: "packet", unix.AF_VSOCK: "vsock",
		unix.AF_ALG: "AF_ALG", unix.AF_XDP: "XDP", unix.AF_BLUETOOTH: "bluetooth",
		unix.AF_CAN: "CAN", unix.AF_TIPC: "TIPC", unix.AF_KEY: "PF_KEY", unix.AF_RDS: "RDS",
	}[family]; ok {
		return name
	}
	return fmt.Sprintf("family %d", family)
}
