package uffd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// KeeperArg0 is the argv[0] of a keeper process. A program that starts
// keepers with StartKeeper (itself, re-executed) must call KeeperMain
// first thing in main, or in an init function, when os.Args[0] is
// KeeperArg0.
const KeeperArg0 = "lazyfs-uffd-keeper"

// Keeper is a small process that holds copies of userfaultfds while they
// are served here, so that they outlive this process if it is killed.
//
// Why: the restored process is traced with PTRACE_O_EXITKILL, so that it
// dies with its pager. But when the pager's process dies, the kernel
// closes its files (releasing a userfaultfd wakes every waiting fault and
// unregisters every range: missing pages then read as zeros) before the
// tracer thread's exit sends the EXITKILL SIGKILLs, or after: the order
// of the threads' exits decides. A copy held elsewhere keeps the ranges
// registered, so faults keep waiting; the keeper drops its copies only
// once this process has fully exited (its pidfd is readable), when every
// tracee already has SIGKILL pending. A thread with SIGKILL pending never
// returns to user space, so no instruction of the process ever sees a
// page that should hold data read as zero.
//
// Protocol: a SOCK_SEQPACKET socket pair; the keeper's end is its fd 3.
// Messages: 'H' + 8-byte id with the fd as SCM_RIGHTS (hold), 'R' + id
// (release), 'D' (done: drop everything and exit). The keeper runs in a
// session of its own, so that a terminal's signals for our process group
// do not reach it.
type Keeper struct {
	mu   sync.Mutex
	sock int
	cmd  *exec.Cmd
	done bool

	exited  chan struct{} // closed when the keeper has exited
	exitErr error         // how, once exited is closed
}

var _ Holder = (*Keeper)(nil)

// StartKeeper starts path (a program that calls KeeperMain when its
// argv[0] is KeeperArg0; normally os.Executable()) as a keeper, with args
// for its setup function. Call Setup before anything else.
func StartKeeper(path string, args ...string) (*Keeper, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("start keeper: socketpair: %w", err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "keeper-socket")
	cmd := &exec.Cmd{
		Path:        path,
		Args:        append([]string{KeeperArg0, strconv.Itoa(os.Getpid())}, args...),
		ExtraFiles:  []*os.File{theirs},
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		unix.Close(fds[0])
		return nil, fmt.Errorf("start keeper: %w", err)
	}
	k := &Keeper{sock: fds[0], cmd: cmd, exited: make(chan struct{})}
	go func() {
		k.exitErr = cmd.Wait()
		close(k.exited)
	}()
	return k, nil
}

// Exited is closed when the keeper process has exited, for whatever
// reason: before Close, that means it died, and the copies it held with
// it.
func (k *Keeper) Exited() <-chan struct{} { return k.exited }

// ExitErr says how the keeper exited, once Exited is closed.
func (k *Keeper) ExitErr() error {
	<-k.exited
	return k.exitErr
}

// Pid returns the keeper's process id.
func (k *Keeper) Pid() int { return k.cmd.Process.Pid }

// Setup waits (at most timeout) for the keeper's answer to its setup: the
// reply of its setup function and the fds it sent, or its error.
func (k *Keeper) Setup(timeout time.Duration) (reply []byte, fds []int, err error) {
	pfd := []unix.PollFd{{Fd: int32(k.sock), Events: unix.POLLIN}}
	deadline := time.Now().Add(timeout)
	for {
		n, err := unix.Poll(pfd, int(time.Until(deadline).Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("keeper setup: %w", err)
		}
		if n == 0 {
			return nil, nil, errors.New("keeper setup: no answer in time")
		}
		break
	}
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4*maxSetupFDs))
	n, oobn, _, _, err := unix.Recvmsg(k.sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, nil, fmt.Errorf("keeper setup: %w", err)
	}
	fds = parseRights(oob[:oobn])
	if n == 0 {
		return nil, nil, errors.New("keeper setup: the keeper exited")
	}
	switch buf[0] {
	case 'S':
		return buf[1:n], fds, nil
	case 'E':
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, nil, fmt.Errorf("keeper setup: %s", buf[1:n])
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	return nil, nil, fmt.Errorf("keeper setup: unexpected message %q", buf[:n])
}

// maxSetupFDs bounds the fds a setup answer carries.
const maxSetupFDs = 8

func parseRights(oob []byte) []int {
	var fds []int
	cms, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	for _, cm := range cms {
		if r, err := unix.ParseUnixRights(&cm); err == nil {
			fds = append(fds, r...)
		}
	}
	return fds
}

func (k *Keeper) send(msg []byte, fd int) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.done {
		return errors.New("keeper: closed")
	}
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	// MSG_DONTWAIT: a keeper that stopped reading must not stall a pager.
	if err := unix.Sendmsg(k.sock, msg, oob, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL); err != nil {
		return fmt.Errorf("keeper: send %c: %w", msg[0], err)
	}
	return nil
}

// Hold hands the keeper a copy of fd (identified by its number here).
func (k *Keeper) Hold(fd int) error {
	msg := binary.LittleEndian.AppendUint64([]byte{'H'}, uint64(fd))
	return k.send(msg, fd)
}

// Release makes the keeper close its copy of fd; call it before closing
// fd here.
func (k *Keeper) Release(fd int) error {
	msg := binary.LittleEndian.AppendUint64([]byte{'R'}, uint64(fd))
	return k.send(msg, -1)
}

// keeperExitWait bounds how long Close waits for the keeper to exit.
const keeperExitWait = 5 * time.Second

// Close tells the keeper to drop every copy and exit, and waits for it.
// The processes it protected must be either dead or fully served: their
// userfaultfds close when the last copy does.
func (k *Keeper) Close() error {
	sendErr := k.send([]byte{'D'}, -1)
	k.mu.Lock()
	k.done = true
	k.mu.Unlock()
	// The socket stays open until the keeper has read 'D' and exited:
	// closing it with its messages to us unread would reset the
	// connection, and the keeper could lose 'D'.
	defer unix.Close(k.sock)
	select {
	case <-k.exited:
		if k.exitErr != nil {
			return fmt.Errorf("keeper: %w", k.exitErr)
		}
		return sendErr
	case <-time.After(keeperExitWait):
		k.cmd.Process.Kill()
		<-k.exited
		return errors.New("keeper: did not exit; killed")
	}
}

// SetupFunc is the extra role of a keeper (serving a mount, say), run
// before it holds anything: args are those given to StartKeeper. It
// returns a reply and fds for the starter (see Keeper.Setup), and what to
// do before the keeper exits; or an error, sent to the starter.
type SetupFunc func(args []string) (reply []byte, fds []int, cleanup func(), err error)

// KeeperMain is the keeper process: it runs setup (if not nil) and sends
// its answer, then holds the fds it is sent until told it is done, or
// until the process that started it has exited. It returns the exit code.
func KeeperMain(args []string, setup SetupFunc) int {
	const sock = 3
	if len(args) < 2 {
		return 2
	}
	parent, err := strconv.Atoi(args[1])
	if err != nil || parent <= 0 {
		return 2
	}
	unix.CloseOnExec(sock)
	pidfd, err := unix.PidfdOpen(parent, 0)
	if err != nil || os.Getppid() != parent {
		// Gone already (or the pid is someone else's now): its exit has
		// run its course, nothing left to protect.
		return 0
	}
	cleanup := func() {}
	answer := []byte{'S'}
	var fds []int
	if setup != nil {
		reply, sfds, c, err := setup(args[2:])
		if err != nil {
			unix.Sendmsg(sock, append([]byte{'E'}, err.Error()...), nil, nil, unix.MSG_NOSIGNAL)
			return 1
		}
		answer, fds = append(answer, reply...), sfds
		if c != nil {
			cleanup = c
		}
	}
	defer cleanup()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := unix.Sendmsg(sock, answer, oob, nil, unix.MSG_NOSIGNAL); err != nil {
		return 1
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	keep(sock, pidfd)
	return 0
}

// keep holds fds sent on sock until 'D', or until pidfd is readable.
func keep(sock, pidfd int) {
	held := map[uint64]int{}
	defer func() {
		for _, fd := range held {
			unix.Close(fd)
		}
	}()
	buf := make([]byte, 64)
	oob := make([]byte, unix.CmsgSpace(4*maxSetupFDs))
	sockOpen := true
	for {
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		if sockOpen {
			fds = append(fds, unix.PollFd{Fd: int32(sock), Events: unix.POLLIN})
		}
		if _, err := unix.Poll(fds, -1); err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		if sockOpen && fds[1].Revents != 0 {
			// Read every queued message before looking at the parent: fds
			// sent just before it died are in them.
			for {
				n, oobn, _, _, err := unix.Recvmsg(sock, buf, oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
				if errors.Is(err, unix.EAGAIN) {
					break
				}
				if errors.Is(err, unix.EINTR) {
					continue
				}
				if err != nil || n == 0 {
					sockOpen = false // EOF: wait for the parent's exit
					break
				}
				got := parseRights(oob[:oobn])
				var id uint64
				if n >= 9 {
					id = binary.LittleEndian.Uint64(buf[1:9])
				}
				switch buf[0] {
				case 'H':
					if len(got) > 0 {
						if old, ok := held[id]; ok {
							unix.Close(old)
						}
						held[id] = got[0]
						got = got[1:]
					}
				case 'R':
					if fd, ok := held[id]; ok {
						unix.Close(fd)
						delete(held, id)
					}
				case 'D':
					return
				}
				for _, fd := range got {
					unix.Close(fd)
				}
			}
		}
		if fds[0].Revents != 0 {
			return
		}
	}
}
