package sockdiag

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
)

// nlmsg wraps payload in a netlink message header.
func nlmsg(typ uint16, payload []byte) []byte {
	n := nlmsgHdrLen + len(payload)
	b := make([]byte, (n+3)&^3)
	binary.NativeEndian.PutUint32(b[0:], uint32(n))
	binary.NativeEndian.PutUint16(b[4:], typ)
	copy(b[nlmsgHdrLen:], payload)
	return b
}

func nlattr(typ uint16, v []byte) []byte {
	n := 4 + len(v)
	b := make([]byte, (n+3)&^3)
	binary.NativeEndian.PutUint16(b[0:], uint16(n))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[4:], v)
	return b
}

func u32s(vs ...uint32) []byte {
	b := make([]byte, 4*len(vs))
	for i, v := range vs {
		binary.NativeEndian.PutUint32(b[4*i:], v)
	}
	return b
}

// sampleInetDiagReply is a TCP listener on 127.0.0.1:8080, backlog 3 of
// 128, inode 4242, followed by NLMSG_DONE.
func sampleInetDiagReply() []byte {
	m := make([]byte, inetDiagMsgLen)
	m[0], m[1] = unix.AF_INET, TCPListen
	binary.BigEndian.PutUint16(m[4:], 8080)
	copy(m[8:], []byte{127, 0, 0, 1})
	binary.NativeEndian.PutUint32(m[56:], 3)
	binary.NativeEndian.PutUint32(m[60:], 128)
	binary.NativeEndian.PutUint32(m[68:], 4242)
	return append(nlmsg(unix.SOCK_DIAG_BY_FAMILY, m), nlmsg(unix.NLMSG_DONE, make([]byte, 4))...)
}

// sampleUnixDiagReply is a stream listener "/run/x.sock" (inode 10, two
// pending clients 11 and 12, backlog 2 of 5) and an abstract datagram
// socket "\0ab\0c" (inode 20, peer 21).
func sampleUnixDiagReply() []byte {
	l := append([]byte{unix.AF_UNIX, unix.SOCK_STREAM, UnixUnconnected + 9, 0}, u32s(10, 1, 0)...)
	l = append(l, nlattr(unixDiagName, []byte("/run/x.sock\x00"))...)
	l = append(l, nlattr(unixDiagIcons, u32s(11, 12))...)
	l = append(l, nlattr(unixDiagRQLen, u32s(2, 5))...)
	l = append(l, nlattr(unixDiagVFS, u32s(99, 0xfe00000))...)
	d := append([]byte{unix.AF_UNIX, unix.SOCK_DGRAM, UnixConnected, 0}, u32s(20, 2, 0)...)
	d = append(d, nlattr(unixDiagName, []byte("\x00ab\x00c"))...)
	d = append(d, nlattr(unixDiagPeer, u32s(21))...)
	d = append(d, nlattr(unixDiagShutdown, []byte{1})...)
	out := append(nlmsg(unix.SOCK_DIAG_BY_FAMILY, l), nlmsg(unix.SOCK_DIAG_BY_FAMILY, d)...)
	return append(out, nlmsg(unix.NLMSG_DONE, make([]byte, 4))...)
}

func TestParseInetDiag(t *testing.T) {
	got, done, err := ParseInetDiag(sampleInetDiagReply(), unix.IPPROTO_TCP, nil)
	if err != nil || !done || len(got) != 1 {
		t.Fatalf("ParseInetDiag = %+v, %v, %v", got, done, err)
	}
	want := InetDiag{Family: unix.AF_INET, Protocol: unix.IPPROTO_TCP, State: TCPListen,
		Local: netip.MustParseAddrPort("127.0.0.1:8080"), Remote: netip.AddrPortFrom(netip.IPv4Unspecified(), 0),
		RQueue: 3, WQueue: 128, Inode: 4242}
	if got[0] != want {
		t.Errorf("got %+v\nwant %+v", got[0], want)
	}
}

func TestParseUnixDiag(t *testing.T) {
	got, done, err := ParseUnixDiag(sampleUnixDiagReply(), nil)
	if err != nil || !done || len(got) != 2 {
		t.Fatalf("ParseUnixDiag = %+v, %v, %v", got, done, err)
	}
	l, d := got[0], got[1]
	if l.Inode != 10 || l.Path != "/run/x.sock" || !slices.Equal(l.Pending, []uint64{11, 12}) || !l.HasRQLen || l.RQueue != 2 || l.WQueue != 5 || l.VFSIno != 99 || l.Cookie != 1 {
		t.Errorf("listener %+v", l)
	}
	if d.Inode != 20 || d.Path != "@ab@c" || d.Peer != 21 || d.Type != unix.SOCK_DGRAM || d.Shutdown != 1 || d.HasRQLen {
		t.Errorf("datagram %+v", d)
	}
}

func TestParseDiagErrors(t *testing.T) {
	errno := -int32(unix.EACCES)
	errMsg := nlmsg(unix.NLMSG_ERROR, u32s(uint32(errno)))
	if _, _, err := ParseUnixDiag(errMsg, nil); !errors.Is(err, unix.EACCES) {
		t.Errorf("NLMSG_ERROR: %v, want EACCES", err)
	}
	good := sampleUnixDiagReply()
	for _, n := range []int{3, nlmsgHdrLen + 3, 40} {
		if _, _, err := ParseUnixDiag(good[:n], nil); !errors.Is(err, proc.ErrMalformed) {
			t.Errorf("truncated to %d: %v", n, err)
		}
	}
	short := nlmsg(unix.SOCK_DIAG_BY_FAMILY, make([]byte, 10))
	if _, _, err := ParseInetDiag(short, unix.IPPROTO_TCP, nil); !errors.Is(err, proc.ErrMalformed) {
		t.Errorf("short inet_diag_msg: %v", err)
	}
	badAttr := nlmsg(unix.SOCK_DIAG_BY_FAMILY, append(make([]byte, unixDiagMsgLen), 0xff, 0, 0, 0))
	if _, _, err := ParseUnixDiag(badAttr, nil); !errors.Is(err, proc.ErrMalformed) {
		t.Errorf("attribute longer than message: %v", err)
	}
}
