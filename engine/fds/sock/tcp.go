package sock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/proc/sockdiag"
)

// Established TCP connections with TCP_REPAIR (dump and restore
// --tcp-established). A socket in repair mode sends nothing and lets its
// state be read and written: the sequence numbers of both queues, the
// bytes in them, the options negotiated at the handshake, the window.
// Dump locks the connection (NetLock), turns repair on through a copy of
// the socket (pidfd_getfd) and reads it all; the socket stays in repair
// mode, so that killing the process closes it without a FIN or a reset.
// Restore makes a socket in the process, turns repair on through a copy,
// binds it, sets the sequence numbers, connects it (no handshake in
// repair mode), sets options, queues and window, and turns repair off.

// TCP_REPAIR_QUEUE values (linux/tcp.h).
const (
	tcpNoQueue   = 0
	tcpRecvQueue = 1
	tcpSendQueue = 2
)

// TCPI_OPT_* bits of tcp_info.tcpi_options.
const (
	tcpiOptTimestamps = 1
	tcpiOptSACK       = 2
	tcpiOptWscale     = 4
)

// maxTCPQueue bounds the bytes read from one queue of a connection.
const maxTCPQueue = 64 << 20

// TCPRepair is what a dump with --tcp-established holds: the lock on the
// connections and a copy of each socket it put in repair mode.
type TCPRepair struct {
	Lock *NetLock
	held []heldSocket
	seen map[uint64]*image.TCPConn
}

type heldSocket struct {
	fd    int
	ino   uint64
	reuse int // SO_REUSEADDR as the program had it (repair off clears it)
}

// NewTCPRepair returns the repair state of a dump of process pid.
func NewTCPRepair(pid int) *TCPRepair {
	return &TCPRepair{Lock: NewNetLock(pid), seen: map[uint64]*image.TCPConn{}}
}

// Resume takes every socket held out of repair mode and releases the
// lock: the connections go on as if nothing happened (a dump that failed
// or leaves the process running). Call it before the process runs again.
func (r *TCPRepair) Resume(log *slog.Logger) error {
	var errs []error
	for _, h := range r.held {
		err := unix.SetsockoptInt(h.fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, unix.TCP_REPAIR_OFF)
		if err == nil && h.reuse != 0 {
			err = unix.SetsockoptInt(h.fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, h.reuse)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("socket:[%d] out of repair mode: %w", h.ino, err))
		}
		unix.Close(h.fd)
	}
	r.held = nil
	if err := r.Lock.Release(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Keep closes the copies of the sockets and keeps the lock for the
// restore. Call it once the process is dead: the sockets then close in
// repair mode, silently.
func (r *TCPRepair) Keep() {
	for _, h := range r.held {
		unix.Close(h.fd)
	}
	r.held = nil
}

// LockConns locks every established TCP connection of the processes
// ds (one, or every process of a tree) at once, with one nft batch,
// before any is taken.
func LockConns(r *TCPRepair, ds []*Dumper) error {
	var conns [][2]netip.AddrPort
	for _, d := range ds {
		if err := d.queryInet(); err != nil {
			return fmt.Errorf("pid %d: %w", d.PID, err)
		}
		n := len(conns)
		for _, f := range d.FDs {
			if f.Kind != proc.FDSocket {
				continue
			}
			if x, ok := d.inet[f.Ino]; ok && x.Protocol == unix.IPPROTO_TCP && x.State == sockdiag.TCPEstablished {
				conns = append(conns, [2]netip.AddrPort{x.Local, x.Remote})
			}
		}
		if len(conns) > n {
			if err := sameNetns(d.PID); err != nil {
				return err
			}
		}
	}
	if err := r.Lock.HoldAll(conns); err != nil {
		if len(ds) == 1 {
			return fmt.Errorf("pid %d: %w", ds[0].PID, err)
		}
		return err
	}
	return nil
}

// sameNetns refuses a process with connections to keep that lives in
// another network namespace than ours (a replica restored with --netns):
// the lock is an nftables table of our namespace, where its packets do
// not pass.
func sameNetns(pid int) error {
	var mine, its unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &mine); err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &its); err != nil {
		return fmt.Errorf("pid %d: network namespace: %w", pid, err)
	}
	if mine.Ino != its.Ino || mine.Dev != its.Dev {
		return fmt.Errorf("%w: pid %d has established TCP connections in another network namespace (net:[%d]) than snapctl's (net:[%d]), where the lock of --tcp-established could not hold them: dump it without --tcp-established (they are then closed at restore)",
			image.ErrUnsupported, pid, its.Ino, mine.Ino)
	}
	return nil
}

// tcpConn takes the state of the established connection sk (fd f) in
// repair mode, under the lock.
func (d *Dumper) tcpConn(f *proc.FD, sk *image.Socket) error {
	r := d.TCP
	if c, ok := r.seen[sk.ID]; ok {
		sk.TCP = c // a dup of a socket taken already
		return nil
	}
	local, err1 := netip.ParseAddrPort(sk.Local)
	peer, err2 := netip.ParseAddrPort(sk.Peer)
	if err1 != nil || err2 != nil {
		return fmt.Errorf("connection %s-%s: no address", sk.Local, sk.Peer)
	}
	if err := r.Lock.Hold(local, peer); err != nil {
		return err
	}
	s, err := unix.PidfdGetfd(d.PIDFD, f.Num, 0)
	if err != nil {
		return fmt.Errorf("pidfd_getfd: %w", err)
	}
	if err := unix.SetsockoptInt(s, unix.IPPROTO_TCP, unix.TCP_REPAIR, unix.TCP_REPAIR_ON); err != nil {
		unix.Close(s)
		return fmt.Errorf("TCP_REPAIR on connection %s-%s: %w", local, peer, err)
	}
	r.held = append(r.held, heldSocket{fd: s, ino: sk.ID, reuse: sk.Options["SO_REUSEADDR"]})
	c, err := readTCP(s)
	if err != nil {
		return fmt.Errorf("connection %s-%s: %w", local, peer, err)
	}
	c.Lock = r.Lock.Table()
	sk.TCP = c
	r.seen[sk.ID] = c
	d.Log.Info("connection kept", "fd", f.Num, "local", local, "peer", peer, "send_queue", len(c.SendQueue), "recv_queue", len(c.RecvQueue))
	return nil
}

// readTCP reads the state of socket s, in repair mode.
func readTCP(s int) (*image.TCPConn, error) {
	info, err := getsockopt(s, unix.IPPROTO_TCP, unix.TCP_INFO, 8)
	if err != nil {
		return nil, fmt.Errorf("TCP_INFO: %w", err)
	}
	if info[0] != sockdiag.TCPEstablished {
		return nil, fmt.Errorf("%w: TCP state %d, not established", image.ErrUnsupported, info[0])
	}
	c := &image.TCPConn{Options: info[5]}
	if c.Options&tcpiOptWscale != 0 {
		c.SndWscale, c.RcvWscale = info[6]&0xf, info[6]>>4
	}
	outq, err := unix.IoctlGetInt(s, unix.SIOCOUTQ)
	if err != nil {
		return nil, fmt.Errorf("SIOCOUTQ: %w", err)
	}
	unsent, err := unix.IoctlGetInt(s, unix.SIOCOUTQNSD)
	if err != nil {
		return nil, fmt.Errorf("SIOCOUTQNSD: %w", err)
	}
	inq, err := unix.IoctlGetInt(s, unix.SIOCINQ)
	if err != nil {
		return nil, fmt.Errorf("SIOCINQ: %w", err)
	}
	mss, err := unix.GetsockoptInt(s, unix.IPPROTO_TCP, unix.TCP_MAXSEG)
	if err != nil {
		return nil, fmt.Errorf("TCP_MAXSEG: %w", err)
	}
	c.MSS = uint32(mss)
	if c.SndBuf, err = unix.GetsockoptInt(s, unix.SOL_SOCKET, unix.SO_SNDBUF); err != nil {
		return nil, fmt.Errorf("SO_SNDBUF: %w", err)
	}
	if c.RcvBuf, err = unix.GetsockoptInt(s, unix.SOL_SOCKET, unix.SO_RCVBUF); err != nil {
		return nil, fmt.Errorf("SO_RCVBUF: %w", err)
	}
	if c.Options&tcpiOptTimestamps != 0 {
		ts, err := unix.GetsockoptInt(s, unix.IPPROTO_TCP, unix.TCP_TIMESTAMP)
		if err != nil {
			return nil, fmt.Errorf("TCP_TIMESTAMP: %w", err)
		}
		c.Timestamp = uint32(ts)
	}
	if w, err := getsockopt(s, unix.IPPROTO_TCP, unix.TCP_REPAIR_WINDOW, 20); err == nil {
		le := binary.LittleEndian
		c.Window = &image.TCPWindow{SndWl1: le.Uint32(w), SndWnd: le.Uint32(w[4:]), MaxWindow: le.Uint32(w[8:]), RcvWnd: le.Uint32(w[12:]), RcvWup: le.Uint32(w[16:])}
	} else if !errors.Is(err, unix.ENOPROTOOPT) {
		return nil, fmt.Errorf("TCP_REPAIR_WINDOW: %w", err)
	}
	if c.RecvSeq, c.RecvQueue, err = readTCPQueue(s, tcpRecvQueue, inq); err != nil {
		return nil, fmt.Errorf("receive queue: %w", err)
	}
	if c.SendSeq, c.SendQueue, err = readTCPQueue(s, tcpSendQueue, outq); err != nil {
		return nil, fmt.Errorf("send queue: %w", err)
	}
	c.Unsent = unsent
	return c, nil
}

// readTCPQueue returns the sequence number at the end of one queue of s
// and its n bytes.
func readTCPQueue(s, queue, n int) (uint32, []byte, error) {
	if n > maxTCPQueue {
		return 0, nil, fmt.Errorf("%w: %d bytes queued (at most %d)", image.ErrUnsupported, n, maxTCPQueue)
	}
	if err := unix.SetsockoptInt(s, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, queue); err != nil {
		return 0, nil, fmt.Errorf("TCP_REPAIR_QUEUE: %w", err)
	}
	seq, err := unix.GetsockoptInt(s, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
	if err != nil {
		return 0, nil, fmt.Errorf("TCP_QUEUE_SEQ: %w", err)
	}
	if n == 0 {
		return uint32(seq), nil, nil
	}
	buf := make([]byte, n+1) // one more, to see there are n
	got, _, err := unix.Recvfrom(s, buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
	if err != nil {
		return 0, nil, fmt.Errorf("peek: %w", err)
	}
	if got != n {
		return 0, nil, fmt.Errorf("peeked %d bytes of %d", got, n)
	}
	return uint32(seq), buf[:n], nil
}

// tcpConn recreates the established connection of f in the process:
// a socket made there, repaired from here through a copy.
func (r *Restorer) tcpConn(f *image.FD, typ uint64) (int, error) {
	s, c := f.Socket, f.Socket.TCP
	local, err1 := netip.ParseAddrPort(s.Local)
	peer, err2 := netip.ParseAddrPort(s.Peer)
	if err1 != nil || err2 != nil {
		return -1, fmt.Errorf("%w: connection %q-%q", image.ErrCorrupt, s.Local, s.Peer)
	}
	fd, err := r.In.Call(unix.SYS_SOCKET, uint64(s.Family), typ, uint64(s.Protocol))
	if err != nil {
		return -1, fmt.Errorf("socket(%d, %d, %d): %w", s.Family, s.Type, s.Protocol, err)
	}
	pidfd, err := r.Host.Pidfd()
	if err != nil {
		return -1, err
	}
	cp, err := unix.PidfdGetfd(pidfd, int(fd), 0)
	if err != nil {
		return -1, fmt.Errorf("pidfd_getfd: %w", err)
	}
	defer unix.Close(cp)
	if err := repairTCP(cp, s.Family, local, peer, c); err != nil {
		return -1, fmt.Errorf("connection %s-%s: %w", local, peer, err)
	}
	if err := r.SetOptions(int(fd), s); err != nil {
		return -1, err
	}
	r.Log.Info("connection restored", "fd", f.FD, "local", local, "peer", peer)
	return int(fd), nil
}

// repairTCP puts socket cp in the place of connection c between local
// and peer: in repair mode, bound, its sequence numbers set, connected
// without a handshake, the options of the handshake set, its queues
// refilled and its window set; then out of repair mode, the bytes never
// sent sent.
func repairTCP(cp, family int, local, peer netip.AddrPort, c *image.TCPConn) error {
	if err := setTCP(cp, "TCP_REPAIR on", unix.TCP_REPAIR, unix.TCP_REPAIR_ON); err != nil {
		return err
	}
	sent := len(c.SendQueue) - c.Unsent
	if sent < 0 || c.Unsent < 0 {
		return fmt.Errorf("%w: %d unsent bytes of a send queue of %d", image.ErrCorrupt, c.Unsent, len(c.SendQueue))
	}
	if err := repairConnect(cp, family, local, peer, c); err != nil {
		return err
	}
	if err := repairOptions(cp, c); err != nil {
		return err
	}
	if err := refillQueues(cp, c, sent); err != nil {
		return err
	}
	if err := repairWindow(cp, c.Window); err != nil {
		return err
	}
	if err := setTCP(cp, "TCP_REPAIR_QUEUE", unix.TCP_REPAIR_QUEUE, tcpNoQueue); err != nil {
		return err
	}
	if err := setTCP(cp, "TCP_REPAIR off", unix.TCP_REPAIR, unix.TCP_REPAIR_OFF); err != nil {
		return err
	}
	// The bytes never sent are sent as the program would have.
	if err := sendAll(cp, c.SendQueue[sent:]); err != nil {
		return fmt.Errorf("send %d unsent bytes: %w", c.Unsent, err)
	}
	return nil
}

// setTCP sets an int TCP option of cp; what names it in an error.
func setTCP(cp int, what string, opt, v int) error {
	if err := unix.SetsockoptInt(cp, unix.IPPROTO_TCP, opt, v); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// repairConnect binds cp, in repair mode, to local, sets the sequence
// number each of its queues starts at, and connects it to peer, which in
// repair mode sends nothing.
func repairConnect(cp, family int, local, peer netip.AddrPort, c *image.TCPConn) error {
	if err := unix.Bind(cp, inetSockaddr(family, local)); err != nil {
		return fmt.Errorf("bind %s: %w", local, err)
	}
	// The kernel moves each sequence number on as the queue is refilled.
	for _, q := range []struct {
		queue int
		seq   uint32
	}{{tcpRecvQueue, c.RecvSeq - uint32(len(c.RecvQueue))}, {tcpSendQueue, c.SendSeq - uint32(len(c.SendQueue))}} {
		if err := setTCP(cp, "TCP_REPAIR_QUEUE", unix.TCP_REPAIR_QUEUE, q.queue); err != nil {
			return err
		}
		if err := setTCP(cp, "TCP_QUEUE_SEQ", unix.TCP_QUEUE_SEQ, int(int32(q.seq))); err != nil {
			return err
		}
	}
	if err := unix.Connect(cp, inetSockaddr(family, peer)); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		return fmt.Errorf("connect in repair mode: %w", err)
	}
	return nil
}

// repairOptions sets the options the handshake negotiated: MSS, SACK,
// window scaling, timestamps (and the timestamp itself).
func repairOptions(cp int, c *image.TCPConn) error {
	opts := []unix.TCPRepairOpt{{Code: unix.TCPOPT_MAXSEG, Val: c.MSS}}
	if c.Options&tcpiOptSACK != 0 {
		opts = append(opts, unix.TCPRepairOpt{Code: unix.TCPOPT_SACK_PERMITTED})
	}
	if c.Options&tcpiOptWscale != 0 {
		opts = append(opts, unix.TCPRepairOpt{Code: unix.TCPOPT_WINDOW, Val: uint32(c.SndWscale) | uint32(c.RcvWscale)<<16})
	}
	if c.Options&tcpiOptTimestamps != 0 {
		opts = append(opts, unix.TCPRepairOpt{Code: unix.TCPOPT_TIMESTAMP})
	}
	if err := unix.SetsockoptTCPRepairOpt(cp, unix.IPPROTO_TCP, unix.TCP_REPAIR_OPTIONS, opts); err != nil {
		return fmt.Errorf("TCP_REPAIR_OPTIONS: %w", err)
	}
	if c.Options&tcpiOptTimestamps != 0 {
		if err := setTCP(cp, "TCP_TIMESTAMP", unix.TCP_TIMESTAMP, int(int32(c.Timestamp))); err != nil {
			return err
		}
	}
	return nil
}

// refillQueues makes room in cp's buffers and refills its receive queue
// and the part of its send queue that was sent (sent bytes).
func refillQueues(cp int, c *image.TCPConn, sent int) error {
	if err := queueRoom(cp, unix.SO_SNDBUF, unix.SO_SNDBUFFORCE, len(c.SendQueue), c.SndBuf); err != nil {
		return err
	}
	if err := queueRoom(cp, unix.SO_RCVBUF, unix.SO_RCVBUFFORCE, len(c.RecvQueue), c.RcvBuf); err != nil {
		return err
	}
	// In repair mode what is sent goes into the queue chosen, as if it
	// had been received from the peer, or sent and not yet acknowledged.
	if err := setTCP(cp, "TCP_REPAIR_QUEUE", unix.TCP_REPAIR_QUEUE, tcpRecvQueue); err != nil {
		return err
	}
	if err := sendAll(cp, c.RecvQueue); err != nil {
		return fmt.Errorf("refill receive queue: %w", err)
	}
	if err := setTCP(cp, "TCP_REPAIR_QUEUE", unix.TCP_REPAIR_QUEUE, tcpSendQueue); err != nil {
		return err
	}
	if err := sendAll(cp, c.SendQueue[:sent]); err != nil {
		return fmt.Errorf("refill send queue: %w", err)
	}
	return nil
}

// repairWindow sets the window of cp as it was, if the dump read it.
func repairWindow(cp int, w *image.TCPWindow) error {
	if w == nil {
		return nil
	}
	b := binary.LittleEndian.AppendUint32(nil, w.SndWl1)
	for _, v := range []uint32{w.SndWnd, w.MaxWindow, w.RcvWnd, w.RcvWup} {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	if err := setsockopt(cp, unix.IPPROTO_TCP, unix.TCP_REPAIR_WINDOW, b); err != nil {
		return fmt.Errorf("TCP_REPAIR_WINDOW: %w", err)
	}
	return nil
}

// queueRoom makes the buffer of socket s (opt, set with force) large
// enough for n queued bytes, if it is not: as large as it was at the dump
// (dumped), or twice n with room for the buffers' overhead. A buffer set
// so no longer grows by itself; one large enough already is left alone,
// to grow as the kernel sees fit.
func queueRoom(s, opt, force, n, dumped int) error {
	cur, err := unix.GetsockoptInt(s, unix.SOL_SOCKET, opt)
	if err != nil {
		return fmt.Errorf("socket buffer size: %w", err)
	}
	want := max(dumped, 2*n+64<<10)
	if n == 0 || cur >= want {
		return nil
	}
	// The kernel doubles the value set, for its bookkeeping.
	if err := unix.SetsockoptInt(s, unix.SOL_SOCKET, force, want/2); err != nil {
		return fmt.Errorf("socket buffer of %d bytes for %d queued: %w", want, n, err)
	}
	return nil
}

// sendAll sends b on s without blocking, in pieces the kernel accepts:
// in repair mode it makes one buffer of each send, so a large one can
// fail with ENOMEM where a smaller one succeeds.
func sendAll(s int, b []byte) error {
	chunk := 256 << 10
	for len(b) > 0 {
		n, err := unix.SendmsgN(s, b[:min(len(b), chunk)], nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		if (errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EAGAIN)) && chunk > 1024 {
			chunk /= 2
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("send made no progress")
		}
		b = b[n:]
	}
	return nil
}

// inetSockaddr is ap as a sockaddr of family.
func inetSockaddr(family int, ap netip.AddrPort) unix.Sockaddr {
	if family == unix.AF_INET {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

// getsockopt reads n bytes of a socket option.
func getsockopt(s, level, opt, n int) ([]byte, error) {
	b := make([]byte, n)
	l := uint32(n)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(s), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		return nil, errno
	}
	return b[:l], nil
}

// setsockopt sets a socket option to the bytes b.
func setsockopt(s, level, opt int, b []byte) error {
	_, _, errno := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(s), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// closedConn logs a connection that the restore brings back closed:
// with a warning, naming the flag that would have kept it, if the dump
// kept it.
func (r *Restorer) closedConn(f *image.FD) {
	s := f.Socket
	if s.TCP != nil {
		r.Log.Warn("connection closed by restore: the snapshot holds it, restore --tcp-established brings it back", "pid", r.Proc.PID, "fd", f.FD, "local", s.Local, "peer", s.Peer)
		return
	}
	r.Log.Warn("connection closed by restore", "pid", r.Proc.PID, "fd", f.FD, "local", s.Local, "peer", s.Peer, "state", s.State)
}
