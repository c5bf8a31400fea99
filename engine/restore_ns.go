package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// Namespaces say which namespaces a restored process lives in. Their zero
// value is snapctl's own.
//
// With PID, the process gets a new pid namespace in which it has the pid
// and thread ids it had (its own view of them, image.Process.OwnPID):
// any number of restores of one snapshot run at once, each in its own
// namespace, and the process sees the ids it cached (glibc's tid in the
// thread descriptor, a server's pid in its own variables) unchanged. It
// is not the namespace's init: a small init (PIDNSInitMain, the pid 1
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
// The UTS, IPC, user and cgroup namespaces stay snapctl's.
type Namespaces struct {
	PID bool
	Net string
}

// NetNew is the Namespaces.Net value for a new network namespace.
const NetNew = "new"

// any reports whether the restore makes or joins a namespace.
func (ns Namespaces) any() bool { return ns.PID || ns.Net != "" }

// OpenNetns opens the network namespace file path for Namespaces.Net and
// checks that it is one.
func OpenNetns(path string) (*os.File, error) {
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

// netnsFD is the descriptor of the network namespace to join in the
// stub, which starts with it there.
const netnsFD = 3

// stubNamespaces returns the CLONE_NEW* flags the stub starts with, its
// argv, and the files it gets (the network namespace to join at
// netnsFD). initPID says whether the stub is to be the new pid
// namespace's init (PIDNSInitMain), of which the restored process is a
// child.
func (r *restorer) stubNamespaces() (flags uintptr, argv []string, files []*os.File, initPID bool) {
	ns := r.opts.Namespaces
	argv = []string{"lazyfs-restore-stub"}
	if ns.PID {
		flags |= unix.CLONE_NEWNS
		if own := r.st.OwnPID(); own != 1 {
			flags |= unix.CLONE_NEWPID
			argv, initPID = []string{PIDNSInitArg0, fmt.Sprint(own)}, true
		}
	}
	switch {
	case ns.Net == NetNew:
		flags |= unix.CLONE_NEWNET
	case ns.Net != "":
		files = []*os.File{nil, nil, nil, r.netns}
	}
	return flags, argv, files, initPID
}

// nsError explains a refusal to create or join namespaces: EPERM is a
// missing CAP_SYS_ADMIN (os.ErrPermission), EINVAL a kernel without them
// (errors.ErrUnsupported).
func nsError(what string, err error) error {
	switch {
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("%s: %w (CAP_SYS_ADMIN is needed)", what, err)
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("%s: %w: %w (does this kernel have namespaces?)", what, errors.ErrUnsupported, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// nsNames names the namespaces of flags, for messages.
func nsNames(flags uintptr) string {
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

// setUpStub prepares the stub's namespaces before the process is cloned
// out of it, by calls injected into it: its mount namespace a slave of
// ours, its new network namespace's loopback up, or the network
// namespace at netnsFD joined.
func (r *restorer) setUpStub(in *ptrace.Injector, flags uintptr) error {
	if flags&unix.CLONE_NEWNS != 0 {
		root, err := in.PutString(0, "/")
		if err != nil {
			return err
		}
		if _, err := in.Call(unix.SYS_MOUNT, 0, root, 0, unix.MS_REC|unix.MS_SLAVE, 0); err != nil {
			return nsError("make the new mount namespace a slave of ours", err)
		}
	}
	switch ns := r.opts.Namespaces.Net; {
	case flags&unix.CLONE_NEWNET != 0:
		if err := loopbackUp(in); err != nil {
			return nsError("bring up the new network namespace's loopback", err)
		}
	case ns != "":
		if _, err := in.Call(unix.SYS_SETNS, netnsFD, unix.CLONE_NEWNET); err != nil {
			return nsError("join network namespace "+ns, err)
		}
		if err := in.CloseFD(netnsFD); err != nil {
			return err
		}
	}
	return nil
}

// loopbackUp sets IFF_UP on lo, as ip link set lo up does, from inside
// the stub (in its network namespace).
func loopbackUp(in *ptrace.Injector) error {
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

// mountProc mounts, from inside the restored process (in the new pid and
// mount namespaces), a /proc of its pid namespace over /proc.
func (r *restorer) mountProc() error {
	at, _ := r.in.Scratch()
	src, err := r.in.PutString(0, "proc")
	if err != nil {
		return err
	}
	if _, err := r.in.PutString(8, "/proc"); err != nil {
		return err
	}
	if _, err := r.in.Call(unix.SYS_MOUNT, src, at+8, src, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, 0); err != nil {
		return nsError("mount /proc in the new pid namespace", err)
	}
	return nil
}

// checkOwnPID checks that task id (ours) has own as its id in its
// innermost pid namespace.
func checkOwnPID(id, own int) error {
	s, err := proc.ReadStatus(id)
	if err != nil {
		return err
	}
	if n := len(s.NSpid); n == 0 || s.NSpid[n-1] != own {
		return fmt.Errorf("task %d has ids %v, wanted %d in its pid namespace", id, s.NSpid, own)
	}
	return nil
}
