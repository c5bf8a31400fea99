// Package helper runs the small processes a restore starts from its own
// program: the userfaultfd keeper (engine/uffd/keeper), the private mount's
// helper (fs) and the init of a new pid namespace (engine/ns). Each is
// the running program executed again under a name of its own as argv[0];
// the package that owns a helper registers its main function under that
// name (Register), and the program calls Main first thing, which runs the
// helper its argv[0] names, if any.
//
// A helper that talks to its starter does so over one protocol: a
// SOCK_SEQPACKET socket pair, the helper's end its descriptor 3; the
// starter's pid as argv[1], so that the helper can watch it (pidfd) and
// end with it; and a first message from the helper, 'S' followed by a
// reply and descriptors (SCM_RIGHTS) once it is set up, or 'E' followed
// by the error that stopped it. The helper runs in a session of its own,
// so that a terminal's signals to the starter's process group do not
// reach it. What follows the first message is the helper's own.
package helper

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

var (
	mu    sync.Mutex
	mains = map[string]func(args []string) int{}
)

// Register makes main the helper run when the program's argv[0] is arg0.
// A second registration of a name panics: two helpers under one name is
// a bug of the build.
func Register(arg0 string, main func(args []string) int) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := mains[arg0]; dup {
		panic("helper: Register called twice for " + arg0)
	}
	mains[arg0] = main
}

// Main runs, and exits with, the helper that os.Args[0] names, if one is
// registered; otherwise it returns. A program that starts helpers calls
// it before anything else (in an init function of package main).
func Main() {
	mu.Lock()
	main, ok := mains[filepath.Base(os.Args[0])]
	mu.Unlock()
	if ok {
		os.Exit(main(os.Args))
	}
}

// sockFD is the helper's end of the socket pair.
const sockFD = 3

// Child is a helper as its starter sees it.
type Child struct {
	cmd  *exec.Cmd
	sock int

	exited  chan struct{} // closed when the helper has exited
	exitErr error         // how, once exited is closed
}

// Start starts path (normally os.Executable()) as the helper arg0, with
// args after the starter's pid; its standard error goes to stderr (nil:
// discarded).
func Start(path, arg0 string, args []string, stderr io.Writer) (*Child, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("start %s: socketpair: %w", arg0, err)
	}
	theirs := os.NewFile(uintptr(fds[1]), arg0+"-socket")
	cmd := &exec.Cmd{
		Path:        path,
		Args:        append([]string{arg0, strconv.Itoa(os.Getpid())}, args...),
		ExtraFiles:  []*os.File{theirs}, // sockFD
		Stderr:      stderr,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		unix.Close(fds[0])
		return nil, fmt.Errorf("start %s: %w", arg0, err)
	}
	c := &Child{cmd: cmd, sock: fds[0], exited: make(chan struct{})}
	go func() {
		c.exitErr = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// ErrExited: the helper exited before it answered.
var ErrExited = errors.New("the helper exited before it answered")

// Setup waits, at most timeout, for the helper's first message: its
// reply and descriptors (at most maxFDs), or the error it sent.
func (c *Child) Setup(timeout time.Duration, maxFDs int) (reply []byte, fds []int, err error) {
	pfd := []unix.PollFd{{Fd: int32(c.sock), Events: unix.POLLIN}}
	deadline := time.Now().Add(timeout)
	for {
		n, err := unix.Poll(pfd, max(int(time.Until(deadline).Milliseconds())+1, 0))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if n == 0 {
			return nil, nil, fmt.Errorf("no answer within %v", timeout)
		}
		break
	}
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4*max(maxFDs, 1)))
	n, oobn, _, _, err := unix.Recvmsg(c.sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
	for errors.Is(err, unix.EINTR) {
		n, oobn, _, _, err = unix.Recvmsg(c.sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
	}
	if err != nil {
		return nil, nil, err
	}
	fds = ParseRights(oob[:oobn])
	switch {
	case n == 0:
		err = ErrExited
	case buf[0] == 'S':
		return buf[1:n], fds, nil
	case buf[0] == 'E':
		err = errors.New(string(buf[1:n]))
	default:
		err = fmt.Errorf("unexpected answer %q", buf[:n])
	}
	CloseAll(fds)
	return nil, nil, err
}

// Send sends msg, with fd as SCM_RIGHTS if fd >= 0. It never blocks: a
// helper that stopped reading fails it (EAGAIN) rather than stall the
// starter.
func (c *Child) Send(msg []byte, fd int) error {
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	return unix.Sendmsg(c.sock, msg, oob, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
}

// CloseSocket closes the starter's end: the helper reads EOF.
func (c *Child) CloseSocket() error { return unix.Close(c.sock) }

// Exited is closed when the helper has exited, for whatever reason.
func (c *Child) Exited() <-chan struct{} { return c.exited }

// ExitErr says how the helper exited, once Exited is closed.
func (c *Child) ExitErr() error {
	<-c.exited
	return c.exitErr
}

// Pid returns the helper's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Path is the program the helper runs.
func (c *Child) Path() string { return c.cmd.Path }

// Kill kills the helper.
func (c *Child) Kill() { c.cmd.Process.Kill() }

// Starter is the starter as its helper sees it: the socket and a pidfd
// of the starter, to end with it.
type Starter struct {
	Sock  int
	Pidfd int
}

// Attach is the first thing a helper's main does with its args (its
// os.Args): it checks them and opens the starter's pidfd. It returns the
// rest of the arguments; if ok is false, the helper exits at once with
// code: 2 for arguments it was not started with, 0 for a starter gone
// already (nobody is left to serve).
func Attach(args []string) (s *Starter, rest []string, code int, ok bool) {
	if len(args) < 2 {
		return nil, nil, 2, false
	}
	parent, err := strconv.Atoi(args[1])
	if err != nil || parent <= 0 {
		return nil, nil, 2, false
	}
	unix.CloseOnExec(sockFD)
	pidfd, err := unix.PidfdOpen(parent, 0)
	if err != nil || os.Getppid() != parent {
		// Gone already, or the pid is someone else's now.
		if err == nil {
			unix.Close(pidfd)
		}
		return nil, nil, 0, false
	}
	return &Starter{Sock: sockFD, Pidfd: pidfd}, args[2:], 0, true
}

// Ready sends the first message: set up, with reply and fds.
func (s *Starter) Ready(reply []byte, fds []int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	return unix.Sendmsg(s.Sock, append([]byte{'S'}, reply...), oob, nil, unix.MSG_NOSIGNAL)
}

// Fail sends the first message: the error that stopped the helper.
func (s *Starter) Fail(err error) {
	unix.Sendmsg(s.Sock, append([]byte{'E'}, err.Error()...), nil, nil, unix.MSG_NOSIGNAL)
}

// Wait returns once the starter has exited or closed its end of the
// socket (messages it sends meanwhile are read and dropped).
func (s *Starter) Wait() {
	buf := make([]byte, 16)
	for {
		fds := []unix.PollFd{{Fd: int32(s.Pidfd), Events: unix.POLLIN}, {Fd: int32(s.Sock), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		if fds[0].Revents != 0 {
			return
		}
		if fds[1].Revents != 0 {
			if n, err := unix.Read(s.Sock, buf); (err == nil && n == 0) || (err != nil && !errors.Is(err, unix.EINTR) && !errors.Is(err, unix.EAGAIN)) {
				return
			}
		}
	}
}

// ParseRights returns the descriptors of the SCM_RIGHTS messages in oob.
func ParseRights(oob []byte) []int {
	cms, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, cm := range cms {
		if r, err := unix.ParseUnixRights(&cm); err == nil {
			fds = append(fds, r...)
		}
	}
	return fds
}

// CloseAll closes fds.
func CloseAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
