package sockdiag

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
)

// MaxSockets bounds the sockets a sock_diag reply parser accepts.
const MaxSockets = 1 << 22

// sock_diag ABI (include/uapi/linux/{sock_diag,inet_diag,unix_diag}.h).
const (
	nlmsgHdrLen      = 16
	inetDiagMsgLen   = 72
	inetDiagReqV2Len = 56
	unixDiagMsgLen   = 16
	unixDiagReqLen   = 24

	unixDiagName     = 0
	unixDiagVFS      = 1
	unixDiagPeer     = 2
	unixDiagIcons    = 3
	unixDiagRQLen    = 4
	unixDiagShutdown = 6
	unixDiagUID      = 7

	udiagShowName     = 0x01
	udiagShowVFS      = 0x02
	udiagShowPeer     = 0x04
	udiagShowIcons    = 0x08
	udiagShowRQLen    = 0x10
	udiagShowUID      = 0x40
	maxPendingPerSock = 1 << 16
)

// InetDiag is one inet socket as sock_diag reports it.
type InetDiag struct {
	Family   int // unix.AF_INET or AF_INET6
	Protocol int // unix.IPPROTO_TCP or IPPROTO_UDP (from the request)
	State    uint8
	Local    netip.AddrPort
	Remote   netip.AddrPort
	// RQueue and WQueue: for a listener, the accept queue length and
	// the maximum backlog (listen's argument, capped by somaxconn);
	// otherwise the bytes in the receive and send queues.
	RQueue, WQueue uint32
	UID            uint32
	Inode          uint64
	Interface      uint32
	Cookie         uint64
}

// UnixDiag is one unix socket as sock_diag reports it.
type UnixDiag struct {
	Inode uint64
	Type  int
	State uint8
	// Path is the bound name: a path, "@name" for abstract (NULs shown
	// as '@'), or empty.
	Path string
	// Peer is the inode of the connected peer, 0 if none. A client
	// whose connection waits in a listener's accept queue has peer 0
	// (the server side has no inode until accepted).
	Peer uint64
	// Pending are, for a listener, the inodes of the client sockets
	// whose connections wait in its accept queue.
	Pending []uint64
	// RQueue and WQueue: for a listener, the accept queue length and
	// the maximum backlog; otherwise queued data.
	RQueue, WQueue uint32
	HasRQLen       bool
	// VFSDev and VFSIno identify the socket file of a path-bound socket.
	VFSDev, VFSIno uint32
	Shutdown       uint8
	UID            uint32
	Cookie         uint64
}

// inetDiagRequest builds an NLM_F_DUMP request for every socket of family
// and protocol.
func inetDiagRequest(family, protocol int, seq uint32) []byte {
	b := make([]byte, nlmsgHdrLen+inetDiagReqV2Len)
	putNlmsgHdr(b, seq)
	r := b[nlmsgHdrLen:]
	r[0] = byte(family)
	r[1] = byte(protocol)
	binary.NativeEndian.PutUint32(r[4:], 0xffffffff) // every state
	return b
}

// unixDiagRequest builds an NLM_F_DUMP request for every unix socket.
func unixDiagRequest(seq uint32) []byte {
	b := make([]byte, nlmsgHdrLen+unixDiagReqLen)
	putNlmsgHdr(b, seq)
	r := b[nlmsgHdrLen:]
	r[0] = unix.AF_UNIX
	binary.NativeEndian.PutUint32(r[4:], 0xffffffff)
	binary.NativeEndian.PutUint32(r[12:], udiagShowName|udiagShowVFS|udiagShowPeer|udiagShowIcons|udiagShowRQLen|udiagShowUID)
	return b
}

func putNlmsgHdr(b []byte, seq uint32) {
	binary.NativeEndian.PutUint32(b[0:], uint32(len(b)))
	binary.NativeEndian.PutUint16(b[4:], unix.SOCK_DIAG_BY_FAMILY)
	binary.NativeEndian.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(b[8:], seq)
}

// netlinkMessages calls fn with the type and payload of each netlink
// message in b. It returns done when it saw NLMSG_DONE, and the error of
// an NLMSG_ERROR message.
func netlinkMessages(b []byte, fn func(typ uint16, payload []byte) error) (done bool, err error) {
	for len(b) > 0 {
		if len(b) < nlmsgHdrLen {
			return false, proc.Malformed("netlink message header", b)
		}
		n := int(binary.NativeEndian.Uint32(b[0:]))
		typ := binary.NativeEndian.Uint16(b[4:])
		if n < nlmsgHdrLen || n > len(b) {
			return false, proc.Malformed("netlink message length", b[:nlmsgHdrLen])
		}
		payload := b[nlmsgHdrLen:n]
		switch typ {
		case unix.NLMSG_DONE:
			return true, nil
		case unix.NLMSG_ERROR:
			if len(payload) < 4 {
				return false, proc.Malformed("netlink error", payload)
			}
			if e := int32(binary.NativeEndian.Uint32(payload)); e != 0 {
				return false, fmt.Errorf("sock_diag: %w", unix.Errno(-e))
			}
		case unix.NLMSG_NOOP:
		default:
			if err := fn(typ, payload); err != nil {
				return false, err
			}
		}
		n = (n + 3) &^ 3
		if n > len(b) {
			n = len(b)
		}
		b = b[n:]
	}
	return false, nil
}

// netlinkAttrs calls fn with the type and value of each attribute in b.
func netlinkAttrs(b []byte, fn func(typ uint16, v []byte) error) error {
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b[0:]))
		typ := binary.NativeEndian.Uint16(b[2:]) & 0x3fff // drop NLA_F_NESTED, NLA_F_NET_BYTEORDER
		if n < 4 || n > len(b) {
			return proc.Malformed("netlink attribute length", b[:4])
		}
		if err := fn(typ, b[4:n]); err != nil {
			return err
		}
		n = (n + 3) &^ 3
		if n > len(b) {
			n = len(b)
		}
		b = b[n:]
	}
	return nil
}

// ParseInetDiag parses a batch of sock_diag replies to an inet request and
// appends the sockets to dst. done reports NLMSG_DONE. protocol is copied
// into each InetDiag (the reply does not carry it).
func ParseInetDiag(b []byte, protocol int, dst []InetDiag) (out []InetDiag, done bool, err error) {
	out = dst
	done, err = netlinkMessages(b, func(typ uint16, p []byte) error {
		if typ != unix.SOCK_DIAG_BY_FAMILY {
			return nil
		}
		if len(p) < inetDiagMsgLen {
			return proc.Malformed("inet_diag_msg", p)
		}
		if len(out) >= MaxSockets {
			return fmt.Errorf("%w: more than %d sockets", proc.ErrTooLarge, MaxSockets)
		}
		d := InetDiag{Family: int(p[0]), Protocol: protocol, State: p[1]}
		sport := binary.BigEndian.Uint16(p[4:])
		dport := binary.BigEndian.Uint16(p[6:])
		switch d.Family {
		case unix.AF_INET:
			d.Local = netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[8:12])), sport)
			d.Remote = netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[24:28])), dport)
		case unix.AF_INET6:
			d.Local = netip.AddrPortFrom(netip.AddrFrom16([16]byte(p[8:24])), sport)
			d.Remote = netip.AddrPortFrom(netip.AddrFrom16([16]byte(p[24:40])), dport)
		default:
			return proc.Malformed("inet_diag_msg family", p[:1])
		}
		d.Interface = binary.NativeEndian.Uint32(p[40:])
		d.Cookie = uint64(binary.NativeEndian.Uint32(p[44:])) | uint64(binary.NativeEndian.Uint32(p[48:]))<<32
		d.RQueue = binary.NativeEndian.Uint32(p[56:])
		d.WQueue = binary.NativeEndian.Uint32(p[60:])
		d.UID = binary.NativeEndian.Uint32(p[64:])
		d.Inode = uint64(binary.NativeEndian.Uint32(p[68:]))
		out = append(out, d)
		return nil
	})
	return out, done, err
}

// ParseUnixDiag parses a batch of sock_diag replies to a unix request and
// appends the sockets to dst. done reports NLMSG_DONE.
func ParseUnixDiag(b []byte, dst []UnixDiag) (out []UnixDiag, done bool, err error) {
	out = dst
	done, err = netlinkMessages(b, func(typ uint16, p []byte) error {
		if typ != unix.SOCK_DIAG_BY_FAMILY {
			return nil
		}
		if len(p) < unixDiagMsgLen {
			return proc.Malformed("unix_diag_msg", p)
		}
		if len(out) >= MaxSockets {
			return fmt.Errorf("%w: more than %d sockets", proc.ErrTooLarge, MaxSockets)
		}
		d := UnixDiag{Type: int(p[1]), State: p[2]}
		d.Inode = uint64(binary.NativeEndian.Uint32(p[4:]))
		d.Cookie = uint64(binary.NativeEndian.Uint32(p[8:])) | uint64(binary.NativeEndian.Uint32(p[12:]))<<32
		err := netlinkAttrs(p[unixDiagMsgLen:], func(t uint16, v []byte) error {
			switch t {
			case unixDiagName:
				name := []byte(string(v))
				if len(name) > 0 && name[0] == 0 {
					// Abstract: every byte is part of the name.
					for i, c := range name {
						if c == 0 {
							name[i] = '@'
						}
					}
				} else if i := bytes.IndexByte(name, 0); i >= 0 {
					name = name[:i] // a path ends at its NUL
				}
				d.Path = string(name)
			case unixDiagVFS:
				if len(v) < 8 {
					return proc.Malformed("UNIX_DIAG_VFS", v)
				}
				d.VFSIno = binary.NativeEndian.Uint32(v[0:])
				d.VFSDev = binary.NativeEndian.Uint32(v[4:])
			case unixDiagPeer:
				if len(v) < 4 {
					return proc.Malformed("UNIX_DIAG_PEER", v)
				}
				d.Peer = uint64(binary.NativeEndian.Uint32(v))
			case unixDiagIcons:
				if len(v)/4 > maxPendingPerSock {
					return fmt.Errorf("%w: more than %d pending connections", proc.ErrTooLarge, maxPendingPerSock)
				}
				d.Pending = make([]uint64, 0, len(v)/4)
				for i := 0; i+4 <= len(v); i += 4 {
					d.Pending = append(d.Pending, uint64(binary.NativeEndian.Uint32(v[i:])))
				}
			case unixDiagRQLen:
				if len(v) < 8 {
					return proc.Malformed("UNIX_DIAG_RQLEN", v)
				}
				d.RQueue = binary.NativeEndian.Uint32(v[0:])
				d.WQueue = binary.NativeEndian.Uint32(v[4:])
				d.HasRQLen = true
			case unixDiagShutdown:
				if len(v) < 1 {
					return proc.Malformed("UNIX_DIAG_SHUTDOWN", v)
				}
				d.Shutdown = v[0]
			case unixDiagUID:
				if len(v) < 4 {
					return proc.Malformed("UNIX_DIAG_UID", v)
				}
				d.UID = binary.NativeEndian.Uint32(v)
			}
			return nil
		})
		if err != nil {
			return err
		}
		out = append(out, d)
		return nil
	})
	return out, done, err
}
