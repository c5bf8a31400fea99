package keeper

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/helper"
)

// maxHeldPerMessage bounds the fds the keeper takes from one message
// (one is sent; more are closed).
const maxHeldPerMessage = 8

// Arg0 is the argv[0] of a keeper process: the running program, executed
// again; this package registers Main under it with engine/helper, whose
// Main a program that starts keepers calls first.
const Arg0 = "lazyfs-uffd-keeper"

func init() { helper.Register(Arg0, Main) }

// Keeper is a small process that holds copies of userfaultfds while they
// are served here, so that they outlive this process if it is killed. It
// is the engine/uffd pager's Options.Holder.
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
// Protocol: engine/helper's, then these messages: 'H' + 8-byte id with
// the fd as SCM_RIGHTS (hold), 'R' + id (release), 'D' (done: drop
// everything and exit).
type Keeper struct {
	c *helper.Child

	mu sync.Mutex
	// +checklocks:mu
	done bool
}

// Start starts path (normally os.Executable(), a program that calls
// helper.Main) as a keeper.
func Start(path string) (*Keeper, error) {
	c, err := helper.Start(path, Arg0, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("keeper: %w", err)
	}
	return &Keeper{c: c}, nil
}

// Exited is closed when the keeper process has exited, for whatever
// reason: before Close, that means it died, and the copies it held with
// it.
func (k *Keeper) Exited() <-chan struct{} { return k.c.Exited() }

// ExitErr says how the keeper exited, once Exited is closed.
func (k *Keeper) ExitErr() error { return k.c.ExitErr() }

// Pid returns the keeper's process id.
func (k *Keeper) Pid() int { return k.c.Pid() }

// Ready waits (at most timeout) until the keeper runs and holds what it
// is sent. Hold does not need it (messages wait in the socket), but a
// caller that must know the keeper is up does.
func (k *Keeper) Ready(timeout time.Duration) error {
	_, fds, err := k.c.Setup(timeout, 1)
	if err != nil {
		return fmt.Errorf("keeper: %w", err)
	}
	helper.CloseAll(fds)
	return nil
}

func (k *Keeper) send(msg []byte, fd int) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.done {
		return errors.New("keeper: closed")
	}
	// Send never blocks: a keeper that stopped reading must not stall a
	// pager.
	if err := k.c.Send(msg, fd); err != nil {
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
	defer k.c.CloseSocket()
	select {
	case <-k.c.Exited():
		if err := k.c.ExitErr(); err != nil {
			return fmt.Errorf("keeper: %w", err)
		}
		return sendErr
	case <-time.After(keeperExitWait):
		k.c.Kill()
		<-k.c.Exited()
		return errors.New("keeper: did not exit; killed")
	}
}

// Main is the keeper process (args is its os.Args): it says it is
// ready, then holds the fds it is sent until told it is done, or until
// the process that started it has exited. It returns the exit code.
func Main(args []string) int {
	st, _, code, ok := helper.Attach(args)
	if !ok {
		return code
	}
	if err := st.Ready(nil, nil); err != nil {
		return 1
	}
	keep(st.Sock, st.Pidfd)
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
	oob := make([]byte, unix.CmsgSpace(4*maxHeldPerMessage))
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
				got := helper.ParseRights(oob[:oobn])
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
