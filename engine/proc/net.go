package proc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// MaxSockets bounds the rows a socket table parser accepts.
const MaxSockets = 1 << 22

// Proto is a socket's protocol as lazyfs tells them apart.
type Proto int

// Protocols.
const (
	ProtoTCP Proto = iota + 1
	ProtoUDP
	ProtoUnix
)

func (p Proto) String() string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoUnix:
		return "unix"
	}
	return "Proto(" + strconv.Itoa(int(p)) + ")"
}

// TCP states (include/net/tcp_states.h), as /proc/net/tcp shows them.
const (
	TCPEstablished = 1
	TCPSynSent     = 2
	TCPSynRecv     = 3
	TCPFinWait1    = 4
	TCPFinWait2    = 5
	TCPTimeWait    = 6
	TCPClose       = 7
	TCPCloseWait   = 8
	TCPLastAck     = 9
	TCPListen      = 10
	TCPClosing     = 11
)

// Unix socket states (SS_*), as /proc/net/unix shows them.
const (
	UnixUnconnected   = 1
	UnixConnecting    = 2
	UnixConnected     = 3
	UnixDisconnecting = 4
)

// Socket is one row of /proc/PID/net/{tcp,tcp6,udp,udp6,unix}.
type Socket struct {
	Inode  uint64 // 0 for sockets no file refers to (TIME_WAIT, accept queue)
	Family int    // unix.AF_INET, AF_INET6 or AF_UNIX
	Proto  Proto
	// State is a TCP state for TCP and UDP (TCPEstablished for a
	// connected UDP socket, TCPClose otherwise) and an SS_* state for
	// unix sockets.
	State uint8
	// Listen reports a listening socket: TCP LISTEN, or a unix socket
	// with __SO_ACCEPTCON.
	Listen bool
	// Local and Remote are the inet addresses (zero for unix).
	Local, Remote netip.AddrPort
	// TxQueue and RxQueue are the queued bytes; for a TCP listener
	// RxQueue is the number of connections waiting in the accept queue.
	TxQueue, RxQueue uint32
	UID              uint32
	// Type is unix.SOCK_STREAM, SOCK_DGRAM or SOCK_SEQPACKET (unix only;
	// inet sockets are stream for TCP, datagram for UDP).
	Type int
	// Path is a unix socket's bound address: a path, "@name" for an
	// abstract name (NUL bytes shown as '@'), or empty if unbound.
	Path string
}

// soAcceptCon is __SO_ACCEPTCON, the unix "Flags" bit of a listener.
const soAcceptCon = 1 << 16

// ParseNetInet parses /proc/net/{tcp,tcp6,udp,udp6} (or udplite). family
// is unix.AF_INET or AF_INET6, proto ProtoTCP or ProtoUDP.
func ParseNetInet(r io.Reader, family int, proto Proto) ([]Socket, error) {
	addrLen := 8
	switch family {
	case unix.AF_INET:
	case unix.AF_INET6:
		addrLen = 32
	default:
		return nil, fmt.Errorf("parse net: family %d is not inet", family)
	}
	if proto != ProtoTCP && proto != ProtoUDP {
		return nil, fmt.Errorf("parse net: %v is not an inet protocol", proto)
	}
	sc := newScanner(r)
	var out []Socket
	var fields [][]byte
	for lineNo := 1; sc.Scan(); lineNo++ {
		line := sc.Bytes()
		fields = splitFields(line, fields[:0])
		if lineNo == 1 {
			if len(fields) == 0 || string(fields[0]) != "sl" {
				return nil, malformed("net table header", line)
			}
			continue
		}
		if len(fields) == 0 {
			continue
		}
		if len(out) >= MaxSockets {
			return nil, fmt.Errorf("%w: more than %d sockets", ErrTooLarge, MaxSockets)
		}
		if len(fields) < 10 {
			return nil, fmt.Errorf("line %d: %w", lineNo, malformed("net row has too few fields", line))
		}
		s := Socket{Family: family, Proto: proto}
		var ok bool
		var err error
		if s.Local, err = parseNetAddr(fields[1], addrLen); err != nil {
			return nil, fmt.Errorf("line %d: %w", lineNo, err)
		}
		if s.Remote, err = parseNetAddr(fields[2], addrLen); err != nil {
			return nil, fmt.Errorf("line %d: %w", lineNo, err)
		}
		st, ok1 := parseUint(fields[3], 16)
		tx, rx, ok2 := cutHex32(fields[4])
		uid, ok3 := parseUint(fields[7], 10)
		s.Inode, ok = parseUint(fields[9], 10)
		if !ok || !ok1 || !ok2 || !ok3 || st > 255 || uid > 1<<32-1 {
			return nil, fmt.Errorf("line %d: %w", lineNo, malformed("net row", line))
		}
		s.State, s.TxQueue, s.RxQueue, s.UID = uint8(st), tx, rx, uint32(uid)
		s.Listen = proto == ProtoTCP && s.State == TCPListen
		if proto == ProtoTCP {
			s.Type = unix.SOCK_STREAM
		} else {
			s.Type = unix.SOCK_DGRAM
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, scanErr(err)
	}
	return out, nil
}

// cutHex32 parses "XXXXXXXX:YYYYYYYY".
func cutHex32(b []byte) (uint32, uint32, bool) {
	for i, c := range b {
		if c == ':' {
			x, ok1 := parseUint(b[:i], 16)
			y, ok2 := parseUint(b[i+1:], 16)
			return uint32(x), uint32(y), ok1 && ok2 && x <= 1<<32-1 && y <= 1<<32-1
		}
	}
	return 0, 0, false
}

// parseNetAddr parses "ADDR:PORT" where ADDR is the address as the kernel
// prints it: each 32-bit word of the network-order address in host byte
// order, as %08X.
func parseNetAddr(b []byte, addrLen int) (netip.AddrPort, error) {
	if len(b) != addrLen+5 || b[addrLen] != ':' {
		return netip.AddrPort{}, malformed("net address", b)
	}
	port, ok := parseUint(b[addrLen+1:], 16)
	if !ok || port > 0xffff {
		return netip.AddrPort{}, malformed("net port", b)
	}
	var raw [16]byte
	for i := 0; i < addrLen/8; i++ {
		w, ok := parseUint(b[8*i:8*i+8], 16)
		if !ok {
			return netip.AddrPort{}, malformed("net address", b)
		}
		binary.NativeEndian.PutUint32(raw[4*i:], uint32(w))
	}
	var a netip.Addr
	if addrLen == 8 {
		a = netip.AddrFrom4([4]byte(raw[:4]))
	} else {
		a = netip.AddrFrom16(raw)
	}
	return netip.AddrPortFrom(a, uint16(port)), nil
}

// ParseNetUnix parses /proc/net/unix.
func ParseNetUnix(r io.Reader) ([]Socket, error) {
	sc := newScanner(r)
	var out []Socket
	for lineNo := 1; sc.Scan(); lineNo++ {
		line := sc.Bytes()
		if lineNo == 1 {
			if f, _ := nextField(line); string(f) != "Num" {
				return nil, malformed("net unix header", line)
			}
			continue
		}
		if len(trimSpace(line)) == 0 {
			continue
		}
		if len(out) >= MaxSockets {
			return nil, fmt.Errorf("%w: more than %d sockets", ErrTooLarge, MaxSockets)
		}
		var f [7][]byte
		rest := line
		for i := range f {
			f[i], rest = nextField(rest)
		}
		flags, ok1 := parseUint(f[3], 16)
		typ, ok2 := parseUint(f[4], 16)
		st, ok3 := parseUint(f[5], 16)
		ino, ok4 := parseUint(f[6], 10)
		if len(f[0]) == 0 || f[0][len(f[0])-1] != ':' || !ok1 || !ok2 || !ok3 || !ok4 || typ > 255 || st > 255 {
			return nil, fmt.Errorf("line %d: %w", lineNo, malformed("net unix row", line))
		}
		out = append(out, Socket{
			Inode:  ino,
			Family: unix.AF_UNIX,
			Proto:  ProtoUnix,
			State:  uint8(st),
			Listen: flags&soAcceptCon != 0,
			Type:   int(typ),
			Path:   string(rest),
		})
	}
	if err := sc.Err(); err != nil {
		return nil, scanErr(err)
	}
	return out, nil
}

// Sockets indexes sockets by inode.
type Sockets map[uint64]Socket

// ReadSockets reads the TCP, UDP and unix socket tables of pid's network
// namespace (/proc/PID/net/...) and indexes them by inode. Rows with inode
// 0 are left out; a table the kernel does not have (tcp6 without IPv6) is
// skipped.
func ReadSockets(pid int) (Sockets, error) {
	tables := []struct {
		name   string
		family int
		proto  Proto
	}{
		{"tcp", unix.AF_INET, ProtoTCP},
		{"tcp6", unix.AF_INET6, ProtoTCP},
		{"udp", unix.AF_INET, ProtoUDP},
		{"udp6", unix.AF_INET6, ProtoUDP},
		{"unix", unix.AF_UNIX, ProtoUnix},
	}
	out := Sockets{}
	for _, t := range tables {
		path := pidPath(pid, "net/"+t.name)
		f, err := os.Open(path)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("read sockets: %w", err)
		}
		var ss []Socket
		if t.proto == ProtoUnix {
			ss, err = ParseNetUnix(f)
		} else {
			ss, err = ParseNetInet(f, t.family, t.proto)
		}
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		for _, s := range ss {
			if s.Inode != 0 {
				out[s.Inode] = s
			}
		}
	}
	return out, nil
}
