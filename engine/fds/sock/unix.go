package sock

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/proc/sockdiag"
)

// unixState fills the state of a unix socket: listening, bound, one end of
// a pair whose other end is in the process (with the data queued to it),
// a datagram socket connected to a named peer, in the process or outside
// (connected again at restore), or a stream connection to a peer outside
// (closed at restore, like an established TCP connection).
func (d *Dumper) unixState(f *proc.FD, s int, sk *image.Socket, listening bool) error {
	if d.unixd == nil {
		ds, err := sockdiag.QueryUnix(d.PID)
		if err != nil {
			return fmt.Errorf("sock_diag: %w", err)
		}
		d.unixd = map[uint64]sockdiag.UnixDiag{}
		for _, x := range ds {
			d.unixd[x.Inode] = x
		}
	}
	diag := d.unixd[sk.ID]
	switch {
	case listening:
		sk.State = sockListen
		sk.Backlog = int(diag.WQueue)
	case diag.Peer != 0 && d.hasSocket(diag.Peer) && d.unixd[diag.Peer].Peer == sk.ID &&
		diag.Path == "" && d.unixd[diag.Peer].Path == "":
		// Two unnamed sockets connected to each other: a socket pair
		// (or an accepted connection, the same to restore).
		sk.State = StateConnected
		sk.Options[PeerInodeOption] = int(diag.Peer)
		q, err := peekQueue(s, sk.Type)
		if err != nil {
			return fmt.Errorf("read queued data: %w", err)
		}
		sk.Queued = q
	case diag.Peer != 0 && sk.Type != unix.SOCK_STREAM && sk.Type != unix.SOCK_SEQPACKET && sk.Peer != "" && sk.Peer != "@":
		sk.State = StateConnected
	case diag.Peer != 0 || sk.Peer != "":
		sk.State = sockEstablished
	case sk.Local != "" && sk.Local != "@":
		sk.State = sockBound
	default:
		sk.State = sockUnbound
	}
	return nil
}

func (d *Dumper) hasSocket(ino uint64) bool {
	if d.TreeSockets[ino] {
		return true
	}
	for _, f := range d.FDs {
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

// ConnectUnix connects each unix datagram socket to its named peer. A
// peer that is gone leaves it unconnected: the program sees its sends
// fail, as it would have.
func (r *Restorer) ConnectUnix() {
	for _, f := range r.connects {
		at, n, err := r.sockaddr(f.Socket.Family, f.Socket.Peer)
		if err == nil {
			_, err = r.In.Call(unix.SYS_CONNECT, uint64(f.FD), at, n)
		}
		if err != nil {
			r.Log.Warn("unix socket not connected again", "fd", f.FD, "peer", f.Socket.Peer, "err", err)
		}
	}
}

// closedUnix returns one end of a new unix socket pair whose other end is
// closed: it stands for a connection to a process outside, which the
// program sees closed by its peer.
func (r *Restorer) closedUnix(f *image.FD, typ uint64) (int, error) {
	at, _ := r.In.Scratch()
	if _, err := r.In.Call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, typ, 0, at); err != nil {
		return -1, fmt.Errorf("socketpair: %w", err)
	}
	var b [8]byte
	if err := r.In.Get(0, b[:]); err != nil {
		return -1, err
	}
	r.closeFD(int(binary.LittleEndian.Uint32(b[4:])))
	fd := int(binary.LittleEndian.Uint32(b[0:]))
	r.closedConn(f)
	return fd, nil
}

// socketPair returns this end of a unix socket pair whose both ends are
// in the process, creating the pair, with the data queued in each end,
// the first time one of its ends is met.
func (r *Restorer) socketPair(f *image.FD, typ uint64) (int, error) {
	s := f.Socket
	if end, ok := r.pairs[s.ID]; ok {
		if err := r.Host.SetFlags(end, f); err != nil {
			return -1, err
		}
		if err := r.SetOptions(end, s); err != nil {
			return -1, err
		}
		return end, nil
	}
	at, _ := r.In.Scratch()
	if _, err := r.In.Call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, typ, 0, at); err != nil {
		return -1, fmt.Errorf("socketpair: %w", err)
	}
	ends, err := r.Host.KeepPair(at)
	if err != nil {
		return -1, err
	}
	a, c := ends[0], ends[1]
	peer := uint64(s.Options[PeerInodeOption])
	if r.pairs == nil {
		r.pairs = map[uint64]int{}
	}
	r.pairs[s.ID] = a
	r.pairs[peer] = c
	if err := r.SetOptions(a, s); err != nil {
		return -1, err
	}
	// What waits in one end was sent from the other.
	if err := r.send(c, s.Type, s.Queued); err != nil {
		return -1, fmt.Errorf("queue %d messages again: %w", len(s.Queued), err)
	}
	for _, g := range r.Proc.FDs {
		if g.Socket != nil && g.Socket.ID == peer && g.SameAs == nil {
			if err := r.send(a, s.Type, g.Socket.Queued); err != nil {
				return -1, fmt.Errorf("queue %d messages again in the peer: %w", len(g.Socket.Queued), err)
			}
			break
		}
	}
	if err := r.Host.SetFlags(a, f); err != nil {
		return -1, err
	}
	return a, nil
}

// send sends msgs on a socket of the process without blocking: a stream
// in pieces, each datagram whole.
func (r *Restorer) send(fd, typ int, msgs [][]byte) error {
	for _, m := range msgs {
		if typ != unix.SOCK_STREAM && len(m) > r.scratchLen() {
			return fmt.Errorf("%w: a queued message of %d bytes (at most %d)", image.ErrUnsupported, len(m), r.scratchLen())
		}
		for len(m) > 0 || typ != unix.SOCK_STREAM {
			n := min(len(m), r.scratchLen())
			at, err := r.In.Put(0, m[:n])
			if err != nil {
				return err
			}
			w, err := r.In.Call(unix.SYS_SENDTO, uint64(fd), at, uint64(n), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
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
