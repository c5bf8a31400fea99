package sock

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

func socketPair(t *testing.T, typ int) (int, int) {
	t.Helper()
	p, err := unix.Socketpair(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p[0], p[1]
}

// recvAll reads what is queued at fd, message by message.
func recvAll(t *testing.T, fd int) [][]byte {
	t.Helper()
	var out [][]byte
	buf := make([]byte, 256<<10)
	for {
		n, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, append([]byte(nil), buf[:n]...))
	}
}

func TestPeekQueueStream(t *testing.T) {
	a, b := socketPair(t, unix.SOCK_STREAM)
	big := bytes.Repeat([]byte("0123456789abcdef"), 10000) // more than one peek buffer
	for _, m := range [][]byte{[]byte("abc"), []byte("defg"), big} {
		if _, err := unix.Write(b, m); err != nil {
			t.Fatal(err)
		}
	}
	want := append([]byte("abcdefg"), big...)
	q, err := peekQueue(a, unix.SOCK_STREAM)
	if err != nil {
		t.Fatal(err)
	}
	if len(q) != 1 || !bytes.Equal(q[0], want) {
		t.Fatalf("peeked %d pieces, %d bytes; want one of %d", len(q), len(bytes.Join(q, nil)), len(want))
	}
	if off, err := unix.GetsockoptInt(a, unix.SOL_SOCKET, unix.SO_PEEK_OFF); err != nil || off != -1 {
		t.Errorf("SO_PEEK_OFF after the peek: %d, %v; want -1 as before", off, err)
	}
	if got := bytes.Join(recvAll(t, a), nil); !bytes.Equal(got, want) {
		t.Errorf("the socket holds %d bytes after the peek, want the %d it had", len(got), len(want))
	}
	if q, err := peekQueue(b, unix.SOCK_STREAM); err != nil || q != nil {
		t.Errorf("empty queue peeked as %q, %v", q, err)
	}
}

func TestPeekQueueDatagrams(t *testing.T) {
	a, b := socketPair(t, unix.SOCK_DGRAM)
	if err := unix.SetsockoptInt(b, unix.SOL_SOCKET, unix.SO_SNDBUF, 1<<20); err != nil {
		t.Fatal(err)
	}
	// The process's own peek offset is kept.
	if err := unix.SetsockoptInt(a, unix.SOL_SOCKET, unix.SO_PEEK_OFF, 0); err != nil {
		t.Fatal(err)
	}
	msgs := [][]byte{[]byte("m1"), []byte("message-2"), bytes.Repeat([]byte{7}, 100000)}
	for _, m := range msgs {
		if err := unix.Send(b, m, 0); err != nil {
			t.Fatal(err)
		}
	}
	q, err := peekQueue(a, unix.SOCK_DGRAM)
	if err != nil {
		t.Fatal(err)
	}
	if len(q) != len(msgs) {
		t.Fatalf("peeked %d messages, want %d", len(q), len(msgs))
	}
	for i := range msgs {
		if !bytes.Equal(q[i], msgs[i]) {
			t.Errorf("message %d peeked as %d bytes, want %d", i, len(q[i]), len(msgs[i]))
		}
	}
	if off, err := unix.GetsockoptInt(a, unix.SOL_SOCKET, unix.SO_PEEK_OFF); err != nil || off != 0 {
		t.Errorf("SO_PEEK_OFF after the peek: %d, %v; want 0 as before", off, err)
	}
	unix.SetsockoptInt(a, unix.SOL_SOCKET, unix.SO_PEEK_OFF, -1)
	got := recvAll(t, a)
	if len(got) != len(msgs) || !bytes.Equal(got[1], msgs[1]) {
		t.Errorf("after the peek the socket holds %d messages, want %d", len(got), len(msgs))
	}
}

func TestPeekQueueRefusesDescriptors(t *testing.T) {
	a, b := socketPair(t, unix.SOCK_STREAM)
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Sendmsg(b, []byte("x"), unix.UnixRights(int(f.Fd())), nil, 0); err != nil {
		t.Fatal(err)
	}
	before := openFDs(t)
	if _, err := peekQueue(a, unix.SOCK_STREAM); !errors.Is(err, image.ErrUnsupported) {
		t.Errorf("a queue with a descriptor in flight peeked with %v, want image.ErrUnsupported", err)
	}
	if after := openFDs(t); after != before {
		t.Errorf("the peek left %d descriptors open, %d before", after, before)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
