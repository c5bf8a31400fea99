package sockdiag

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
)

// diagTimeout bounds each receive from the sock_diag socket.
const diagTimeout = 5 * time.Second

// maxDiagBatches bounds the replies read for one dump.
const maxDiagBatches = 1 << 20

// QueryInet lists the inet sockets of one family (unix.AF_INET or
// AF_INET6) and protocol (unix.IPPROTO_TCP or IPPROTO_UDP) in pid's network
// namespace with sock_diag. For a namespace other than the caller's it
// needs CAP_SYS_ADMIN (setns).
func QueryInet(pid, family, protocol int) ([]InetDiag, error) {
	var out []InetDiag
	err := diagDump(pid, inetDiagRequest(family, protocol, 1), func(b []byte) (bool, error) {
		var done bool
		var err error
		out, done, err = ParseInetDiag(b, protocol, out)
		return done, err
	})
	if err != nil {
		return nil, fmt.Errorf("inet_diag family %d protocol %d: %w", family, protocol, err)
	}
	return out, nil
}

// QueryUnix lists the unix sockets of pid's network namespace with
// sock_diag, with their names, peers, pending connections and queue
// lengths.
func QueryUnix(pid int) ([]UnixDiag, error) {
	var out []UnixDiag
	err := diagDump(pid, unixDiagRequest(1), func(b []byte) (bool, error) {
		var done bool
		var err error
		out, done, err = ParseUnixDiag(b, out)
		return done, err
	})
	if err != nil {
		return nil, fmt.Errorf("unix_diag: %w", err)
	}
	return out, nil
}

// diagDump sends req on a sock_diag socket in pid's network namespace and
// hands each reply batch to parse until it reports done.
func diagDump(pid int, req []byte, parse func([]byte) (bool, error)) error {
	fd, err := diagSocket(pid)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(diagTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fmt.Errorf("set receive timeout: %w", err)
	}
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	buf := make([]byte, 64<<10)
	for i := 0; i < maxDiagBatches; i++ {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("receive: %w", err)
		}
		if n == 0 {
			return proc.Malformed("sock_diag: empty reply", nil)
		}
		done, err := parse(buf[:n])
		if err != nil {
			return err
		}
		if done {
			return nil
		}
	}
	return fmt.Errorf("%w: more than %d sock_diag replies", proc.ErrTooLarge, maxDiagBatches)
}

// diagSocket opens a NETLINK_SOCK_DIAG socket in pid's network namespace:
// directly when it is the caller's, otherwise from a thread that enters
// the namespace for the socket call and leaves it again (a thread that
// cannot leave is not returned to the Go scheduler).
func diagSocket(pid int) (int, error) {
	open := func() (int, error) {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
		if err != nil {
			return -1, fmt.Errorf("socket(NETLINK_SOCK_DIAG): %w", err)
		}
		return fd, nil
	}
	same, err := sameNetns(pid)
	if err != nil {
		return -1, err
	}
	if same {
		return open()
	}
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := inNetns(pid, open)
		if err == nil || !errors.Is(err, errNetnsStuck) {
			runtime.UnlockOSThread()
		}
		ch <- result{fd, err}
	}()
	r := <-ch
	return r.fd, r.err
}

var errNetnsStuck = errors.New("cannot return to the original network namespace")

// inNetns runs fn on the current (locked) thread inside pid's network
// namespace.
func inNetns(pid int, fn func() (int, error)) (int, error) {
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return -1, fmt.Errorf("open own netns: %w", err)
	}
	defer self.Close()
	target, err := os.Open(netnsPath(pid))
	if err != nil {
		return -1, fmt.Errorf("open netns of %d: %w", pid, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return -1, fmt.Errorf("setns into netns of %d: %w", pid, err)
	}
	fd, ferr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("%w: %w", errNetnsStuck, err)
	}
	return fd, ferr
}

// sameNetns reports whether pid is in the caller's network namespace.
func sameNetns(pid int) (bool, error) {
	a, err := proc.StatFile("/proc/thread-self/ns/net")
	if err != nil {
		return false, err
	}
	b, err := proc.StatFile(netnsPath(pid))
	if err != nil {
		return false, err
	}
	return a.Dev == b.Dev && a.Ino == b.Ino, nil
}

// netnsPath is the /proc file naming pid's network namespace.
func netnsPath(pid int) string { return "/proc/" + strconv.Itoa(pid) + "/ns/net" }
