package broker

import (
	"encoding/binary"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds/sock"
	"github.com/lazyfs/lazyfs/engine/fds/tty"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
)

// Broker is the fds.Tree of a restore: it holds, in snapctl, the objects the
// processes of a tree share, and hands them to the processes that need
// them: pidfd_getfd injected into the process, on a pidfd of snapctl.
type Broker struct {
	mine   map[string]int // key -> our descriptor
	pidfds map[int]int    // pid -> our pidfd of it
}

// New returns an empty broker; Close closes what it holds.
func New() *Broker { return &Broker{mine: map[string]int{}, pidfds: map[int]int{}} }

// MakeShared makes, in snapctl, the pipes and socket pairs whose ends are
// in several of the processes sts (makeShared), and holds them.
func (b *Broker) MakeShared(sts []*image.Process) error {
	objs, err := makeShared(sts)
	for k, fd := range objs {
		b.mine[k] = fd
	}
	if err != nil {
		return err
	}
	return tty.MakePairs(sts, b.mine)
}

// GiveInherited takes a copy of each open file description of process st
// (pid in our pid namespace) that processes after it in sts inherited
// (image.FDTree), while st holds them: the process made, its descriptors
// restored, before those that inherited them are.
func (b *Broker) GiveInherited(pid int, st *image.Process, sts []*image.Process) error {
	var nums []int
	for _, q := range sts {
		for _, f := range q.FDs {
			if f.Tree != nil && f.Tree.PID == st.PID && !slices.Contains(nums, f.Tree.FD) {
				nums = append(nums, f.Tree.FD)
			}
		}
	}
	for _, fd := range nums {
		if err := b.Give(pid, OFDKey(st.PID, fd), fd); err != nil {
			return fmt.Errorf("fd %d: %w", fd, err)
		}
	}
	return nil
}

// Injector runs system calls in a process and passes their arguments
// through its scratch memory: what PassFD asks of a *syscalls.Injector.
type Injector interface {
	Call(nr int, args ...uint64) (uint64, error)
	Put(off int, b []byte) (uint64, error)
	Get(off int, b []byte) error
	Scratch() (addr uint64, n int)
	CloseFD(fd int) error
}

// Take puts the object key into the process that in injects into and
// returns its descriptor there, close-on-exec (passed through a socket
// pair: the process may be in a pid namespace where snapctl has no pid).
func (b *Broker) Take(in *syscalls.Injector, key string) (int, bool, error) {
	fd, ok := b.mine[key]
	if !ok {
		return -1, false, nil
	}
	pidfd, err := b.pidfd(in.Thread().Process().Pid())
	if err != nil {
		return -1, true, err
	}
	nfd, err := PassFD(in, pidfd, fd, true)
	if err != nil {
		return -1, true, fmt.Errorf("%s: %w", key, err)
	}
	return nfd, true, nil
}

// pidfd returns our pidfd of process pid, opened once.
func (b *Broker) pidfd(pid int) (int, error) {
	if fd, ok := b.pidfds[pid]; ok {
		return fd, nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	b.pidfds[pid] = fd
	return fd, nil
}

// Give takes a copy of descriptor fd of process pid as key.
func (b *Broker) Give(pid int, key string, fd int) error {
	if _, ok := b.mine[key]; ok {
		return nil
	}
	pidfd, err := b.pidfd(pid)
	if err != nil {
		return err
	}
	nfd, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return fmt.Errorf("pidfd_getfd %d of pid %d: %w", fd, pid, err)
	}
	b.mine[key] = nfd
	return nil
}

// Close closes every descriptor the broker holds.
func (b *Broker) Close() {
	for _, fd := range b.mine {
		unix.Close(fd)
	}
	for _, fd := range b.pidfds {
		unix.Close(fd)
	}
	b.mine, b.pidfds = nil, nil
}

// OFDKey names the open file description of descriptor fd of process pid.
func OFDKey(pid, fd int) string { return fmt.Sprintf("fd:%d:%d", pid, fd) }

// PipeKey names one end of a pipe shared between processes.
func PipeKey(id uint64, read bool) string {
	if read {
		return fmt.Sprintf("pipe:%d:r", id)
	}
	return fmt.Sprintf("pipe:%d:w", id)
}

// UnixKey names the end, socket inode ino, of a socket pair shared
// between processes.
func UnixKey(ino uint64) string { return fmt.Sprintf("unix:%d", ino) }

// makeShared creates, in this process, the pipes and socket pairs that
// processes of the tree sts share (image.FDTree.Shared), with the bytes
// that were in flight in them, and returns them by key (PipeKey,
// UnixKey). The caller closes them.
func makeShared(sts []*image.Process) (map[string]int, error) {
	out := map[string]int{}
	fail := func(err error) (map[string]int, error) {
		for _, fd := range out {
			unix.Close(fd)
		}
		return nil, err
	}
	for _, st := range sts {
		for _, f := range st.FDs {
			if f.Tree == nil || !f.Tree.Shared {
				continue
			}
			switch {
			case f.Pipe != nil:
				if _, ok := out[PipeKey(f.Pipe.ID, true)]; ok {
					continue
				}
				var p [2]int
				if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
					return fail(fmt.Errorf("pipe2: %w", err))
				}
				out[PipeKey(f.Pipe.ID, true)], out[PipeKey(f.Pipe.ID, false)] = p[0], p[1]
				if err := fillPipe(p[1], sts, f.Pipe.ID); err != nil {
					return fail(fmt.Errorf("pipe:[%d]: %w", f.Pipe.ID, err))
				}
			case f.Socket != nil:
				s := f.Socket
				if _, ok := out[UnixKey(s.ID)]; ok {
					continue
				}
				peer := uint64(s.Options[sock.PeerInodeOption])
				p, err := unix.Socketpair(unix.AF_UNIX, s.Type|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					return fail(fmt.Errorf("socketpair: %w", err))
				}
				out[UnixKey(s.ID)], out[UnixKey(peer)] = p[0], p[1]
				// What waits in one end was sent from the other.
				if err := sendQueued(p[1], s.Type, queuedOf(sts, s.ID)); err != nil {
					return fail(fmt.Errorf("socket:[%d]: %w", s.ID, err))
				}
				if err := sendQueued(p[0], s.Type, queuedOf(sts, peer)); err != nil {
					return fail(fmt.Errorf("socket:[%d]: %w", peer, err))
				}
			}
		}
	}
	return out, nil
}

// fillPipe sets the size of pipe id and writes the bytes that were in
// flight into its write end w.
func fillPipe(w int, sts []*image.Process, id uint64) error {
	for _, st := range sts {
		for _, g := range st.FDs {
			if g.Pipe == nil || g.Pipe.ID != id || (g.Pipe.Size == 0 && len(g.Pipe.Buffered) == 0) {
				continue
			}
			if g.Pipe.Size > 0 {
				if _, err := unix.FcntlInt(uintptr(w), unix.F_SETPIPE_SZ, g.Pipe.Size); err != nil {
					return fmt.Errorf("F_SETPIPE_SZ %d: %w", g.Pipe.Size, err)
				}
			}
			for b := g.Pipe.Buffered; len(b) > 0; {
				n, err := unix.Write(w, b)
				if err != nil {
					return fmt.Errorf("refill with %d bytes: %w", len(g.Pipe.Buffered), err)
				}
				b = b[n:]
			}
			return nil
		}
	}
	return nil
}

// queuedOf is the data dumped as queued in socket ino.
func queuedOf(sts []*image.Process, ino uint64) [][]byte {
	for _, st := range sts {
		for _, g := range st.FDs {
			if g.Socket != nil && g.Socket.ID == ino && g.Tree != nil && g.Tree.Shared {
				return g.Socket.Queued
			}
		}
	}
	return nil
}

// sendQueued sends msgs on fd, a socket of type typ, without blocking:
// each a message of its own unless typ is a stream.
func sendQueued(fd, typ int, msgs [][]byte) error {
	for _, m := range msgs {
		for len(m) > 0 || typ != unix.SOCK_STREAM {
			n, err := unix.SendmsgN(fd, m, nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
			if err != nil {
				return fmt.Errorf("queue %d bytes again: %w", len(m), err)
			}
			if typ != unix.SOCK_STREAM {
				break
			}
			m = m[n:]
		}
	}
	return nil
}

// PassFD gives the process that in injects into (of which pidfd is our
// pidfd) a descriptor of the same open file as our fd n: the process makes
// a datagram socket pair, we send n (SCM_RIGHTS) into one end through a
// copy of it, the process receives it from the other. It needs no pid of
// ours that the process can see (it may be in a pid namespace of its own).
func PassFD(in Injector, pidfd, n int, cloexec bool) (int, error) {
	at, _ := in.Scratch()
	if _, err := in.Call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0, at); err != nil {
		return -1, fmt.Errorf("socketpair: %w", err)
	}
	var b [8]byte
	if err := in.Get(0, b[:]); err != nil {
		return -1, err
	}
	a, c := int(binary.LittleEndian.Uint32(b[:])), int(binary.LittleEndian.Uint32(b[4:]))
	defer in.CloseFD(a) // errors of these closes change nothing for the process
	defer in.CloseFD(c)
	cp, err := unix.PidfdGetfd(pidfd, c, 0)
	if err != nil {
		return -1, fmt.Errorf("pidfd_getfd: %w", err)
	}
	err = unix.Sendmsg(cp, []byte{0}, unix.UnixRights(n), nil, unix.MSG_DONTWAIT)
	unix.Close(cp)
	if err != nil {
		return -1, fmt.Errorf("sendmsg: %w", err)
	}
	// struct msghdr at 0, its iovec at 64, one byte of data at 96, the
	// control buffer at 128.
	const iovOff, dataOff, ctlOff = 64, 96, 128
	ctlLen := unix.CmsgSpace(4)
	le := binary.LittleEndian
	hdr := make([]byte, 56)
	le.PutUint64(hdr[16:], at+iovOff) // msg_iov
	le.PutUint64(hdr[24:], 1)         // msg_iovlen
	le.PutUint64(hdr[32:], at+ctlOff) // msg_control
	le.PutUint64(hdr[40:], uint64(ctlLen))
	iov := le.AppendUint64(le.AppendUint64(nil, at+dataOff), 1)
	if _, err := in.Put(0, hdr); err != nil {
		return -1, err
	}
	if _, err := in.Put(iovOff, iov); err != nil {
		return -1, err
	}
	if _, err := in.Put(ctlOff, make([]byte, ctlLen)); err != nil {
		return -1, err
	}
	flags := uint64(unix.MSG_DONTWAIT)
	if cloexec {
		flags |= unix.MSG_CMSG_CLOEXEC
	}
	if _, err := in.Call(unix.SYS_RECVMSG, uint64(a), at, flags); err != nil {
		return -1, fmt.Errorf("recvmsg: %w", err)
	}
	ctl := make([]byte, ctlLen)
	if err := in.Get(ctlOff, ctl); err != nil {
		return -1, err
	}
	msgs, err := unix.ParseSocketControlMessage(ctl)
	if err != nil || len(msgs) != 1 {
		return -1, fmt.Errorf("no descriptor received (%v)", err)
	}
	got, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(got) != 1 {
		return -1, fmt.Errorf("no descriptor received (%v)", err)
	}
	return got[0], nil
}
