// Package ns makes and joins the namespaces a restore asks for
// (Namespaces): the stub the restored processes are cloned from starts
// in them (Stub), its new network namespace's loopback up or another
// joined (SetUpStub), /proc of a new pid namespace mounted (MountProc);
// and the small init of a new pid namespace (InitMain).
package ns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc/kernel"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
)

// Namespaces say which namespaces restored processes live in. Their zero
// value is snapctl's own.
//
// With PID, the process gets a new pid namespace in which it has the pid
// and thread ids it had (its own view of them, image.Process.OwnPID):
// any number of restores of one snapshot run at once, each in its own
// namespace, and the process sees the ids it cached (glibc's tid in the
// thread descriptor, a server's pid in its own variables) unchanged. It
// is not the namespace's init: a small init (InitMain, the pid 1
// there) is its parent, reaps what it orphans, passes on the signals it
// gets (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) and exits
// with the process's status when it ends, which ends the namespace. A
// process that was pid 1 of its namespace at the dump becomes the init
// of the new one instead. Its outer pid (RestoreResult.PID) is the one
// to signal and wait for from outside. PID also gives the process a
// mount namespace of its own (a slave copy of ours: mounts made outside
// still show in it, none of its own leak out) in which /proc is the new
// pid namespace's, so that /proc/self and /proc/PID agree with getpid.
//
// With Net, sockets are recreated in another network namespace: NetNew
// makes an empty one with only the loopback device, up; any other value
// is the path of a network namespace file to join (as ip netns add
// makes under /run/netns, or /proc/PID/ns/net). A listening socket bound
// to an address that namespace lacks fails to bind, and the restore
// with it.
//
// With PID or Net, the UTS, IPC, user and cgroup namespaces stay
// snapctl's.
//
// With Into, the processes are restored into the namespaces (mount,
// network, IPC, UTS, cgroup and pid) and the cgroups of the running
// process Into: a container's, as its runtime made it (its placeholder,
// say). Their paths are then its mount namespace's, their sockets its
// network namespace's, and their pids and thread ids their own view of
// them, in its pid namespace, where they must be free.
type Namespaces struct {
	PID  bool
	Net  string
	Into int
	// Detach are the file system types (as mountinfo names them:
	// "fuse.lazyfs") whose mounts a new mount namespace drops from the
	// copy of ours it starts with: on a host whose / is private, an
	// unmount outside never reaches that copy, which would hold the file
	// system, and a FUSE mount's server, for as long as the restored
	// processes live.
	Detach []string
}

// NetNew is the Namespaces.Net value for a new network namespace.
const NetNew = "new"

// OpenNet opens the network namespace file path for Namespaces.Net and
// checks that it is one.
func OpenNet(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("network namespace: %w", err)
	}
	t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE)
	if err == nil && t != unix.CLONE_NEWNET {
		err = fmt.Errorf("%s is a namespace, not a network one", path)
	} else if err != nil {
		err = fmt.Errorf("%s is not a namespace file: %w", path, err)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// joinFD is the descriptor the stub starts with: the network namespace
// to join (Net a path), or a pidfd of the process whose namespaces it
// joins (Into).
const joinFD = 3

// intoKinds are the namespaces Into joins, by one setns of a pidfd.
const intoKinds = unix.CLONE_NEWNS | unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWPID | unix.CLONE_NEWCGROUP

// OwnPIDs says whether the processes get their own view of their pids
// (image.Process.OwnPID) in a pid namespace below ours: a new one (PID)
// or the one they join (Into).
func (ns Namespaces) OwnPIDs() bool { return ns.PID || ns.Into != 0 }

// Stub returns the CLONE_NEW* flags the stub of a restore starts with,
// its argv, and the files it gets (join at joinFD: the network namespace
// to join that OpenNet opened, or the pidfd of Into that OpenInto
// opened). own is the root's pid in its own pid namespace; initPID says whether the stub is to be the new pid
// namespace's init (InitMain), of which the root is a child, or the root
// the init itself (it was pid 1 of its namespace).
func (ns Namespaces) Stub(own int, join *os.File) (flags uintptr, argv []string, files []*os.File, initPID bool) {
	argv = []string{"lazyfs-restore-stub"}
	if ns.PID {
		flags |= unix.CLONE_NEWNS
		if own != 1 {
			flags |= unix.CLONE_NEWPID
			argv, initPID = []string{InitArg0, fmt.Sprint(own)}, true
		}
	}
	switch {
	case ns.Net == NetNew:
		flags |= unix.CLONE_NEWNET
	case ns.Net != "" || ns.Into != 0:
		files = []*os.File{nil, nil, nil, join}
	}
	return flags, argv, files, initPID
}

// Error explains a refusal to create or join namespaces: EPERM is a
// missing CAP_SYS_ADMIN (os.ErrPermission), EINVAL a kernel without them
// (errors.ErrUnsupported).
func Error(what string, err error) error {
	switch {
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("%s: %w (CAP_SYS_ADMIN is needed)", what, err)
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("%s: %w: %w (does this kernel have namespaces?)", what, errors.ErrUnsupported, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Names names the namespaces of flags, for messages.
func Names(flags uintptr) string {
	var n []string
	for _, f := range []struct {
		flag uintptr
		name string
	}{{unix.CLONE_NEWPID, "pid"}, {unix.CLONE_NEWNS, "mount"}, {unix.CLONE_NEWNET, "network"}} {
		if flags&f.flag != 0 {
			n = append(n, f.name)
		}
	}
	return strings.Join(n, ", ")
}

// SetUpStub prepares the namespaces of the stub (started with flags)
// before the processes are cloned out of it, by calls injected into it: its mount namespace a slave of
// ours, its new network namespace's loopback up, or the network
// namespace at netFD joined.
func (ns Namespaces) SetUpStub(in *syscalls.Injector, flags uintptr) error {
	if flags&unix.CLONE_NEWNS != 0 {
		root, err := in.PutString(0, "/")
		if err != nil {
			return err
		}
		if _, err := in.Call(unix.SYS_MOUNT, 0, root, 0, unix.MS_REC|unix.MS_SLAVE, 0); err != nil {
			return Error("make the new mount namespace a slave of ours", err)
		}
		if err := detachMounts(in, ns.Detach); err != nil {
			return err
		}
	}
	switch net := ns.Net; {
	case flags&unix.CLONE_NEWNET != 0:
		if err := loopbackUp(in); err != nil {
			return Error("bring up the new network namespace's loopback", err)
		}
	case net != "":
		if _, err := in.Call(unix.SYS_SETNS, joinFD, unix.CLONE_NEWNET); err != nil {
			return Error("join network namespace "+net, err)
		}
		if err := in.CloseFD(joinFD); err != nil {
			return err
		}
	}
	if ns.Into != 0 {
		return ns.joinInto(in)
	}
	return nil
}

// CheckInto refuses a process Into in a user namespace not ours (a
// rootless container's, or any user's unshare -U): its owner rules its
// mount namespace, and could change the files a process restored as
// root runs.
func (ns Namespaces) CheckInto() error {
	its, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/user", ns.Into))
	if err != nil {
		return fmt.Errorf("process %d, to restore into: %w", ns.Into, err)
	}
	mine, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		return err
	}
	if its != mine {
		return fmt.Errorf("process %d lives in a user namespace of its own (%s): a restore into it could run the processes on files its owner changes", ns.Into, its)
	}
	return nil
}

// OpenInto opens a pidfd of Into, to hand the stub (Stub).
func (ns Namespaces) OpenInto() (*os.File, error) {
	fd, err := unix.PidfdOpen(ns.Into, 0)
	if err != nil {
		return nil, fmt.Errorf("process %d, to restore into: %w", ns.Into, err)
	}
	return os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", ns.Into)), nil
}

// joinInto puts the stub in the cgroups of Into, then in its namespaces:
// the processes cloned from it inherit both.
func (ns Namespaces) joinInto(in *syscalls.Injector) error {
	if err := JoinCgroups(in.Thread().Tid(), ns.Into); err != nil {
		return err
	}
	if _, err := in.Call(unix.SYS_SETNS, joinFD, intoKinds); err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("join the namespaces of process %d: %w (setns of a pidfd needs Linux 5.8)", ns.Into, err)
		}
		return Error(fmt.Sprintf("join the namespaces of process %d", ns.Into), err)
	}
	return in.CloseFD(joinFD)
}

// detachMounts unmounts lazily (MNT_DETACH), in the mount namespace of
// the stub in, every mount of the file system types fstypes, the mounts
// on them first.
func detachMounts(in *syscalls.Injector, fstypes []string) error {
	if len(fstypes) == 0 {
		return nil
	}
	ms, err := kernel.Mounts(in.Thread().Tid())
	if err != nil {
		return err
	}
	for i := len(ms) - 1; i >= 0; i-- {
		if !slices.Contains(fstypes, ms[i].FSType) {
			continue
		}
		path, err := in.PutString(0, ms[i].Path)
		if err != nil {
			return err
		}
		// EINVAL: no longer a mount (one below it went first).
		if _, err := in.Call(unix.SYS_UMOUNT2, path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return Error("drop the copy of "+ms[i].FSType+" mount "+ms[i].Path+" from the new mount namespace", err)
		}
	}
	return nil
}

// loopbackUp sets IFF_UP on lo, as ip link set lo up does, from inside
// the stub (in its network namespace).
func loopbackUp(in *syscalls.Injector) error {
	s, err := in.Call(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer in.CloseFD(int(s))
	var ifr [unix.IFNAMSIZ + 24]byte // struct ifreq
	copy(ifr[:], "lo")
	at, err := in.Put(0, ifr[:])
	if err != nil {
		return err
	}
	if _, err := in.Call(unix.SYS_IOCTL, s, unix.SIOCGIFFLAGS, at); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS lo: %w", err)
	}
	if err := in.Get(0, ifr[:]); err != nil {
		return err
	}
	fl := binary.LittleEndian.Uint16(ifr[unix.IFNAMSIZ:])
	binary.LittleEndian.PutUint16(ifr[unix.IFNAMSIZ:], fl|unix.IFF_UP)
	if _, err := in.Put(0, ifr[:]); err != nil {
		return err
	}
	if _, err := in.Call(unix.SYS_IOCTL, s, unix.SIOCSIFFLAGS, at); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS lo: %w", err)
	}
	return nil
}

// MountProc mounts, from inside the restored process that in injects
// into (in the new pid and mount namespaces), a /proc of its pid
// namespace over /proc.
func MountProc(in *syscalls.Injector) error {
	at, _ := in.Scratch()
	src, err := in.PutString(0, "proc")
	if err != nil {
		return err
	}
	if _, err := in.PutString(8, "/proc"); err != nil {
		return err
	}
	if _, err := in.Call(unix.SYS_MOUNT, src, at+8, src, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, 0); err != nil {
		return Error("mount /proc in the new pid namespace", err)
	}
	return nil
}

// ReapInit waits for the pid namespace's init, our child, to exit, so
// that it leaves no zombie while we run (a program that restores many
// times). The tracer does not wait for it once detached.
func ReapInit(pid int) {
	for {
		_, err := unix.Wait4(pid, nil, 0, nil)
		if err != unix.EINTR {
			return
		}
	}
}
