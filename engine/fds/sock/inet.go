package sock

import (
	"fmt"
	"log/slog"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc/sockdiag"
)

// inetState fills the state and backlog of a TCP or UDP socket. A TCP
// socket in any connection state (established, or on its way in or out)
// is a connection: restore brings it back closed.
func (d *Dumper) inetState(sk *image.Socket, listening bool) error {
	if err := d.queryInet(); err != nil {
		return err
	}
	diag, ok := d.inet[sk.ID]
	switch {
	case listening:
		sk.State = sockListen
		if ok {
			sk.Backlog = int(diag.WQueue) // max backlog of a listener
		}
	case sk.Type == unix.SOCK_STREAM && ok && diag.State != sockdiag.TCPClose:
		sk.State = sockEstablished
		if diag.State != sockdiag.TCPEstablished {
			sk.State = fmt.Sprintf("tcp-state-%d", diag.State)
		}
	case sk.Type == unix.SOCK_STREAM && sk.Peer != "":
		sk.State = sockEstablished
	case sk.Peer != "":
		sk.State = StateConnected
	case sk.Local != "" && !isUnspecifiedPortZero(sk.Local):
		sk.State = sockBound
	default:
		sk.State = sockUnbound
	}
	return nil
}

// queryInet asks sock_diag, once, for the TCP and UDP sockets of the
// process's network namespace.
func (d *Dumper) queryInet() error {
	if d.inet != nil {
		return nil
	}
	inet := map[uint64]sockdiag.InetDiag{}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		for _, pr := range []int{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			ds, err := sockdiag.QueryInet(d.PID, fam, pr)
			if err != nil {
				return fmt.Errorf("sock_diag: %w", err)
			}
			for _, x := range ds {
				inet[x.Inode] = x
			}
		}
	}
	d.inet = inet
	return nil
}

func isUnspecifiedPortZero(s string) bool {
	ap, err := netip.ParseAddrPort(s)
	return err == nil && ap.Port() == 0 && ap.Addr().IsUnspecified()
}

// ResetConnections sets SO_LINGER {on, 0 s} on every TCP connection of
// the process, which is about to be killed: its close then sends a reset
// and leaves no TIME_WAIT or FIN_WAIT socket behind. Those would hold the
// ports of its listeners, and a listener without SO_REUSEADDR could not
// be bound again by the restore until they expire. The peers see their
// connection reset, as restore --tcp-close has it. Connections taken with
// TCP_REPAIR are left alone: they close silently in repair mode, and
// their peers wait for the restore behind the network lock. Failures are only
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
		if s == nil || f.SameAs != nil || s.TCP != nil || s.Type != unix.SOCK_STREAM ||
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
