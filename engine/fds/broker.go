package fds

import (
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds/tty"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// Broker is the Tree of a restore: it holds, in snapctl, the objects the
// processes of a tree share, and hands them to the processes that need
// them: pidfd_getfd injected into the process, on a pidfd of snapctl.
type Broker struct {
	mine   map[string]int // key -> our descriptor
	pidfds map[int]int    // pid -> our pidfd of it
}

// NewBroker returns an empty broker; Close closes what it holds.
func NewBroker() *Broker { return &Broker{mine: map[string]int{}, pidfds: map[int]int{}} }

// MakeShared makes, in snapctl, the pipes and socket pairs whose ends are
// in several of the processes sts (MakeShared), and holds them.
func (b *Broker) MakeShared(sts []*image.Process) error {
	objs, err := MakeShared(sts)
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

// Take puts the object key into the process that in injects into and
// returns its descriptor there, close-on-exec (passed through a socket
// pair: the process may be in a pid namespace where snapctl has no pid).
func (b *Broker) Take(in *ptrace.Injector, key string) (int, bool, error) {
	fd, ok := b.mine[key]
	if !ok {
		return -1, false, nil
	}
	pidfd, err := b.pidfd(in.Thread().Process().Pid())
	if err != nil {
		return -1, true, err
	}
	nfd, err := passFD(in, pidfd, fd, true)
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
