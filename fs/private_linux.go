package fs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

// PrivateArg0 is the argv[0] of the helper process that serves a private
// mount (MountPrivate): the running program, re-executed. A program that
// calls MountPrivate must run PrivateMain before anything else when
// os.Args[0] is PrivateArg0, in an init function:
//
//	func init() {
//		if filepath.Base(os.Args[0]) == fs.PrivateArg0 {
//			os.Exit(fs.PrivateMain(os.Args))
//		}
//	}
const PrivateArg0 = "lazyfs-private-mount"

// privateSetupWait bounds how long MountPrivate waits for its helper to
// mount; privateExitWait how long Close waits for it to unmount and exit.
const (
	privateSetupWait = 30 * time.Second
	privateExitWait  = 5 * time.Second
)

// privateArgs is what MountPrivate hands its helper, as JSON in argv[2].
type privateArgs struct {
	Dir               string
	PID               int
	Others            []int // more processes whose mem files are opened
	CacheSize         int64
	DecompressThreads int
	DirectIO          bool
	ReadaheadKB       int
	TrustSnapshot     bool
	Remote            image.RemoteOptions
	// Identities are the identity files of opts.Keys (paths: no key
	// crosses the command line).
	Identities []string
}

// PrivateMount is a snapshot mounted for one reader: the MNT/PID/mem file
// of a mount that a helper process serves (see MountPrivate). It is an
// io.ReaderAt of the process's memory at its addresses.
type PrivateMount struct {
	f       *os.File
	pid     int              // the process of f
	others  map[int]*os.File // MNT/PID/mem of the other processes (MountPrivateTree)
	cmd     *exec.Cmd
	sock    int
	mnt     string        // the helper's mountpoint
	exited  chan struct{} // closed when the helper has exited
	exitErr error         // how, once exited is closed

	once sync.Once
	err  error
}

// MountPrivate mounts the snapshot in dir for this process alone and
// returns the memory of process pid, read through the mount.
//
// The mount is served by a helper process, this program re-executed (see
// PrivateArg0), never by this process: a process whose threads wait on
// requests to its own FUSE server cannot exit when killed (the requests
// wait uninterruptibly for answers its dead server threads never send).
// As root the helper mounts in a mount namespace of its own: nobody else
// sees the mount, and it goes with the helper whatever happens. The
// helper unmounts and exits on Close, or when this process has exited (a
// SIGKILLed reader too, once every thread of it is gone); if the helper
// dies, reads fail (ENOTCONN) rather than hang. Without root the mount is
// in the shared namespace, and Close removes what a dead helper left.
//
// The helper runs a mount of opts; Cache, Logger and Debug do not cross
// the process boundary and are ignored. The helper logs its warnings and
// errors (a read that failed, and why; an object store that is slow to
// answer) to this process's standard error, marked as its own.
func MountPrivate(dir string, pid int, opts Options) (*PrivateMount, error) {
	return MountPrivateTree(dir, []int{pid}, opts)
}

// MountPrivateTree is MountPrivate for the processes pids of a tree, all
// read through one mount (one cache, one helper): the PrivateMount reads
// the memory of pids[0]; Mem gives the others'.
func MountPrivateTree(dir string, pids []int, opts Options) (*PrivateMount, error) {
	if len(pids) == 0 {
		return nil, errors.New("private mount: no process")
	}
	abs := dir
	if !image.IsRemote(dir) {
		var err error
		if abs, err = filepath.Abs(dir); err != nil {
			return nil, err
		}
	}
	args, err := json.Marshal(privateArgs{Dir: abs, PID: pids[0], Others: pids[1:], CacheSize: opts.CacheSize,
		DecompressThreads: opts.DecompressThreads, DirectIO: opts.DirectIO, ReadaheadKB: opts.ReadaheadKB,
		TrustSnapshot: opts.TrustSnapshot, Remote: opts.Remote, Identities: opts.Keys.Files()})
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("private mount: %w", err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("private mount: socketpair: %w", err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "private-mount-socket")
	cmd := &exec.Cmd{
		Path:       exe,
		Args:       []string{PrivateArg0, strconv.Itoa(os.Getpid()), string(args)},
		ExtraFiles: []*os.File{theirs}, // fd 3
		// Its warnings and errors (a store that stalls, a read that
		// failed and why) are ours: the reader of the mount sees only
		// EIO. Through a pipe of our own, so that a helper that outlives
		// us never holds our standard error open.
		Stderr: stderrCopier{},
		// A session of its own: a terminal's signals for our process
		// group must not take the mount away before we are done with it.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		unix.Close(fds[0])
		return nil, fmt.Errorf("private mount: start helper: %w", err)
	}
	m := &PrivateMount{cmd: cmd, sock: fds[0], exited: make(chan struct{}), pid: pids[0], others: map[int]*os.File{}}
	go func() {
		m.exitErr = cmd.Wait()
		close(m.exited)
	}()
	if err := m.setup(pids[1:]); err != nil {
		m.Close()
		return nil, fmt.Errorf("private mount: %w", err)
	}
	return m, nil
}

// setup waits for the helper's answer: "S" + mountpoint with the fds of
// MNT/PID/mem and of each of others', or "E" + its error.
func (m *PrivateMount) setup(others []int) error {
	pfd := []unix.PollFd{{Fd: int32(m.sock), Events: unix.POLLIN}}
	deadline := time.Now().Add(privateSetupWait)
	for {
		n, err := unix.Poll(pfd, int(time.Until(deadline).Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("the helper did not mount within %v", privateSetupWait)
		}
		break
	}
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4*(1+len(others))))
	n, oobn, _, _, err := unix.Recvmsg(m.sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return err
	}
	var fds []int
	if cms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, cm := range cms {
			if r, err := unix.ParseUnixRights(&cm); err == nil {
				fds = append(fds, r...)
			}
		}
	}
	switch {
	case n == 0:
		err = fmt.Errorf("the helper exited (does %s run fs.PrivateMain as %s?)", filepath.Base(m.cmd.Path), PrivateArg0)
	case buf[0] == 'E':
		err = errors.New(string(buf[1:n]))
	case buf[0] != 'S' || len(fds) != 1+len(others):
		err = fmt.Errorf("the helper answered %q with %d fds", buf[:n], len(fds))
	}
	if err != nil {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return err
	}
	m.mnt = string(buf[1:n])
	m.f = os.NewFile(uintptr(fds[0]), filepath.Join(m.mnt, "mem"))
	for i, pid := range others {
		m.others[pid] = os.NewFile(uintptr(fds[1+i]), filepath.Join(m.mnt, strconv.Itoa(pid), "mem"))
	}
	return nil
}

// Mem returns the memory of process pid of the snapshot, one of those
// the mount was made for.
func (m *PrivateMount) Mem(pid int) (io.ReaderAt, error) {
	if f, ok := m.others[pid]; ok {
		return f, nil
	}
	if pid == m.pid {
		return m, nil
	}
	return nil, fmt.Errorf("private mount: no process %d", pid)
}

// ReadAt reads the memory at address off (MNT/PID/mem at offset off).
func (m *PrivateMount) ReadAt(p []byte, off int64) (int, error) { return m.f.ReadAt(p, off) }

// Exited is closed when the helper process has exited: before Close, that
// means it died, and reads fail from then on.
func (m *PrivateMount) Exited() <-chan struct{} { return m.exited }

// ExitErr says how the helper exited, once Exited is closed.
func (m *PrivateMount) ExitErr() error {
	<-m.exited
	return m.exitErr
}

// HelperPID returns the process id of the helper that serves the mount.
func (m *PrivateMount) HelperPID() int { return m.cmd.Process.Pid }

// Close closes the file, makes the helper unmount and exit, and waits
// for it (killing it if it does not exit in time). It returns how the
// helper ended. Safe to call more than once.
func (m *PrivateMount) Close() error {
	m.once.Do(func() { m.err = m.close() })
	return m.err
}

func (m *PrivateMount) close() error {
	if m.f != nil {
		m.f.Close()
	}
	for _, f := range m.others {
		f.Close()
	}
	unix.Close(m.sock) // the helper reads EOF: unmount and exit
	var err error
	select {
	case <-m.exited:
		err = m.exitErr
	case <-time.After(privateExitWait):
		// A helper killed while one of its threads waited on its own
		// mount (while it set up) cannot exit until the FUSE
		// connection is aborted.
		m.abort()
		m.cmd.Process.Kill()
		select {
		case <-m.exited:
		case <-time.After(privateExitWait):
			return fmt.Errorf("private mount helper %d: killed, and still there", m.cmd.Process.Pid)
		}
		err = fmt.Errorf("did not exit within %v; killed", privateExitWait)
	}
	if err != nil {
		err = fmt.Errorf("private mount helper: %w", err)
	}
	if m.mnt != "" {
		// A helper that died could not clean up: a mount of ours in the
		// shared namespace (not root) and the mountpoint directory.
		if e, ferr := findMount(m.mnt); ferr == nil && e.fstype == FSType {
			err = errors.Join(err, ForceUnmount(m.mnt))
		}
		if rerr := os.Remove(m.mnt); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
	}
	return err
}

// abort aborts the FUSE connection of the helper's mount, found in its
// mount namespace (/proc/PID/mountinfo), where fusectl allows (root).
// Abort ends the mount at once, for a restore that is itself ending (a
// signal): the FUSE connection is aborted, so that every read waiting on
// the helper (a store that stalls) fails now, and the helper is killed.
// Close is still to be called.
func (m *PrivateMount) Abort() {
	m.abort()
	m.cmd.Process.Kill()
}

func (m *PrivateMount) abort() {
	if m.mnt == "" {
		return
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", m.cmd.Process.Pid))
	if err != nil {
		return
	}
	if e, ok := parseMountinfo(b, m.mnt); ok && e.fstype == FSType {
		abortConnection(e.dev)
	}
}

// stderrCopier is the helper's standard error: exec copies what it writes
// to ours through a pipe (an io.Writer that is not an *os.File).
type stderrCopier struct{}

func (stderrCopier) Write(p []byte) (int, error) { return os.Stderr.Write(p) }

// PrivateMain is the helper process of MountPrivate (args is its
// os.Args): it mounts, sends the starter the mountpoint and an fd of
// MNT/PID/mem, then serves until the starter closes its end or has
// exited, and unmounts. It returns the exit code.
func PrivateMain(args []string) int {
	const sock = 3
	if len(args) != 3 {
		return 2
	}
	parent, err := strconv.Atoi(args[1])
	if err != nil || parent <= 0 {
		return 2
	}
	unix.CloseOnExec(sock)
	pidfd, err := unix.PidfdOpen(parent, 0)
	if err != nil || os.Getppid() != parent {
		return 0 // the starter is gone already: nobody to serve
	}
	fail := func(err error) int {
		unix.Sendmsg(sock, append([]byte{'E'}, err.Error()...), nil, nil, unix.MSG_NOSIGNAL)
		return 1
	}
	// Setting up may wait long on the snapshot (an object store that
	// stalls): if the starter ends meanwhile (its own restore ended),
	// nobody waits for this mount, so end now rather than when the reads
	// time out: the store's reads are cancelled, the setup fails and
	// undoes what it did (the mount, its directory). Should it still not
	// return, the helper exits anyway, removing the directory if it can.
	setUp := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var tmpDir atomic.Pointer[string]
	go func() {
		waitStarter(sock, pidfd)
		select {
		case <-setUp:
		default:
			cancel()
			select {
			case <-setUp:
			case <-time.After(privateExitWait):
				if d := tmpDir.Load(); d != nil {
					unix.Unmount(*d, unix.MNT_DETACH)
					os.Remove(*d)
				}
				os.Exit(0)
			}
		}
	}()
	var pa privateArgs
	if err := json.Unmarshal([]byte(args[2]), &pa); err != nil {
		return fail(fmt.Errorf("helper arguments: %w", err))
	}
	pa.Remote.Context = ctx
	// The mount namespace is this thread's (unshare of CLONE_FS and
	// CLONE_NEWNS is per thread): mount, open, unmount all happen on it,
	// and fusermount3 is started from it.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err == nil {
		// Without it the mount would propagate to the shared parent.
		if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fail(fmt.Errorf("private mount namespace: %w", err))
		}
		// The copies of the other lazyfs mounts go: an unmount outside
		// never reaches this private copy, which would keep their file
		// systems, and their servers, until this helper ends.
		detachLazyfs(unix.Gettid())
	} // else not root: the mount is in the shared namespace (see MountPrivate)
	tmp, err := os.MkdirTemp("", "lazyfs-private-")
	if err != nil {
		return fail(err)
	}
	tmpDir.Store(&tmp)
	defer os.Remove(tmp)
	keys, err := image.LoadKeyring(pa.Identities)
	if err != nil {
		return fail(err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("from", "private mount")
	slog.SetDefault(logger) // the object store's warnings too
	srv, err := Mount(pa.Dir, tmp, Options{CacheSize: pa.CacheSize, DecompressThreads: pa.DecompressThreads,
		DirectIO: pa.DirectIO, ReadaheadKB: pa.ReadaheadKB, TrustSnapshot: pa.TrustSnapshot, Remote: pa.Remote, Keys: keys,
		Logger: logger, directMount: true})
	if err != nil {
		return fail(fmt.Errorf("mount snapshot: %w", err))
	}
	defer srv.Unmount()
	var fds []int
	for _, pid := range append([]int{pa.PID}, pa.Others...) {
		f, err := os.Open(srv.MemPath(pid))
		if err != nil {
			return fail(fmt.Errorf("open pages through the mount: %w", err))
		}
		defer f.Close()
		fds = append(fds, int(f.Fd()))
	}
	close(setUp)
	err = unix.Sendmsg(sock, append([]byte{'S'}, tmp...), unix.UnixRights(fds...), nil, unix.MSG_NOSIGNAL)
	if err != nil {
		return 1
	}
	waitStarter(sock, pidfd)
	return 0
}

// waitStarter returns once sock reads EOF (the starter's Close, or its
// exit) or pidfd is readable (the starter has exited).
func waitStarter(sock, pidfd int) {
	buf := make([]byte, 16)
	for {
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}, {Fd: int32(sock), Events: unix.POLLIN}}
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
			if n, err := unix.Read(sock, buf); (err == nil && n == 0) || (err != nil && !errors.Is(err, unix.EINTR) && !errors.Is(err, unix.EAGAIN)) {
				return
			}
		}
	}
}
