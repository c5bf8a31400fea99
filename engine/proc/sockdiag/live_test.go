package sockdiag

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// socketInode returns the inode of socket fd, which sock_diag reports.
func socketInode(t *testing.T, fd int) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// newSocket opens a socket closed at cleanup.
func newSocket(t *testing.T, domain, typ int) int {
	t.Helper()
	fd, err := unix.Socket(domain, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// TestQueryInetListener: a TCP listener with one connection waiting in its
// accept queue shows the queue length and its backlog.
func TestQueryInetListener(t *testing.T) {
	l := newSocket(t, unix.AF_INET, unix.SOCK_STREAM)
	if err := unix.Bind(l, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(l, 7); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(l)
	if err != nil {
		t.Fatal(err)
	}
	port := sa.(*unix.SockaddrInet4).Port
	c := newSocket(t, unix.AF_INET, unix.SOCK_STREAM)
	if err := unix.Connect(c, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: port}); err != nil {
		t.Fatal(err)
	}
	inet, err := QueryInet(os.Getpid(), unix.AF_INET, unix.IPPROTO_TCP)
	if err != nil {
		t.Fatal(err)
	}
	var ld *InetDiag
	for i := range inet {
		if inet[i].Inode == socketInode(t, l) {
			ld = &inet[i]
		}
	}
	if ld == nil || ld.State != TCPListen || ld.RQueue != 1 || ld.WQueue != 7 || ld.Local.Port() != uint16(port) {
		t.Errorf("inet_diag listener %+v, want backlog 1 of 7", ld)
	}
}

// TestQueryUnix: a unix listener lists the client waiting in its accept
// queue, and the two ends of a socket pair name each other as peers.
func TestQueryUnix(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l.sock")
	l := newSocket(t, unix.AF_UNIX, unix.SOCK_STREAM)
	if err := unix.Bind(l, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(l, 5); err != nil {
		t.Fatal(err)
	}
	c := newSocket(t, unix.AF_UNIX, unix.SOCK_STREAM)
	if err := unix.Connect(c, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(pair[0]); unix.Close(pair[1]) })
	us, err := QueryUnix(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	ud := map[uint64]UnixDiag{}
	for _, u := range us {
		ud[u.Inode] = u
	}
	ul := ud[socketInode(t, l)]
	if !ul.HasRQLen || ul.RQueue != 1 || ul.WQueue != 5 || len(ul.Pending) != 1 || ul.Path != path {
		t.Errorf("unix_diag listener %+v, want backlog 1 of 5 and one pending", ul)
	}
	if cl := ud[socketInode(t, c)]; len(ul.Pending) == 1 && (ul.Pending[0] != cl.Inode || cl.Peer != 0) {
		t.Errorf("unix listener's pending %d, want the client %+v (peer 0: not accepted)", ul.Pending[0], cl)
	}
	if pa, pb := ud[socketInode(t, pair[0])], ud[socketInode(t, pair[1])]; pa.Peer != pb.Inode || pb.Peer != pa.Inode || pa.Type != unix.SOCK_SEQPACKET {
		t.Errorf("socketpair peers %+v %+v", pa, pb)
	}
}
