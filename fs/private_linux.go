package fs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/helper"
	"github.com/lazyfs/lazyfs/engine/image/seal"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

// PrivateArg0 is the argv[0] of the helper process that serves a private
// mount (MountPrivate): the running program, executed again. This package
// registers PrivateMain under it with engine/helper, whose Main a program
// that calls MountPrivate calls first.
const PrivateArg0 = "lazyfs-private-mount"

func init() { helper.Register(PrivateArg0, PrivateMain) }

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
	Remote            store.Options
	// Identities are the identity files of opts.Keys (paths: no key
	// crosses the command line).
	Identities []string
}

// PrivateMount is a snapshot mounted for one reader: the MNT/PID/mem file
// of a mount that a helper process serves (see MountPrivate). It is an
// io.ReaderAt of the process's memory at its addresses.
type PrivateMount struct {
	f      *os.File
	pid    int              // the process of f
	others map[int]*os.File // MNT/PID/mem of the other processes (MountPrivateTree)
	c      *helper.Child
	mnt    string // the helper's mountpoint

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
	if !store.IsRemote(dir) {
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
	// Its log goes to our standard error as it is then, not as it was
	// when the command started (a test that swaps os.Stderr).
	c, err := helper.Start(exe, PrivateArg0, []string{string(args)}, stderrCopier{})
	if err != nil {
		return nil, fmt.Errorf("private mount: %w", err)
	}
	m := &PrivateMount{c: c, pid: pids[0], others: map[int]*os.File{}}
	if err := m.setup(pids[1:]); err != nil {
		m.Close()
		return nil, fmt.Errorf("private mount: %w", err)
	}
	return m, nil
}

// setup waits for the helper's answer: "S" + mountpoint with the fds of
// MNT/PID/mem and of each of others', or "E" + its error.
func (m *PrivateMount) setup(others []int) error {
	reply, fds, err := m.c.Setup(privateSetupWait, 1+len(others))
	switch {
	case errors.Is(err, helper.ErrExited):
		return fmt.Errorf("the helper exited (does %s call helper.Main?)", filepath.Base(m.c.Path()))
	case err != nil:
		return err
	case len(fds) != 1+len(others):
		helper.CloseAll(fds)
		return fmt.Errorf("the helper answered with %d fds, want %d", len(fds), 1+len(others))
	}
	m.mnt = string(reply)
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
func (m *PrivateMount) Exited() <-chan struct{} { return m.c.Exited() }

// ExitErr says how the helper exited, once Exited is closed.
func (m *PrivateMount) ExitErr() error { return m.c.ExitErr() }

// HelperPID returns the process id of the helper that serves the mount.
func (m *PrivateMount) HelperPID() int { return m.c.Pid() }

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
	m.c.CloseSocket() // the helper reads EOF: unmount and exit
	var err error
	select {
	case <-m.c.Exited():
		err = m.c.ExitErr()
	case <-time.After(privateExitWait):
		// A helper killed while one of its threads waited on its own
		// mount (while it set up) cannot exit until the FUSE
		// connection is aborted.
		m.abort()
		m.c.Kill()
		select {
		case <-m.c.Exited():
		case <-time.After(privateExitWait):
			return fmt.Errorf("private mount helper %d: killed, and still there", m.c.Pid())
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
	m.c.Kill()
}

func (m *PrivateMount) abort() {
	if m.mnt == "" {
		return
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", m.c.Pid()))
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
	st, rest, code, ok := helper.Attach(args)
	if !ok {
		return code
	}
	if len(rest) != 1 {
		return 2
	}
	fail := func(err error) int {
		st.Fail(err)
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
	go endWithStarter(st, setUp, cancel, &tmpDir)
	var pa privateArgs
	if err := json.Unmarshal([]byte(rest[0]), &pa); err != nil {
		return fail(fmt.Errorf("helper arguments: %w", err))
	}
	pa.Remote.Context = ctx
	// The mount namespace is this thread's (unshare of CLONE_FS and
	// CLONE_NEWNS is per thread): mount, open, unmount all happen on it,
	// and fusermount3 is started from it.
	runtime.LockOSThread()
	if err := privateNamespace(); err != nil {
		return fail(err)
	}
	tmp, err := os.MkdirTemp("", "lazyfs-private-")
	if err != nil {
		return fail(err)
	}
	tmpDir.Store(&tmp)
	defer os.Remove(tmp)
	keys, err := seal.LoadKeyring(pa.Identities)
	if err != nil {
		return fail(err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("from", "private mount")
	slog.SetDefault(logger) // the object store's warnings too
	srv, err := Mount(pa.Dir, tmp, Options{CacheSize: pa.CacheSize, DecompressThreads: pa.DecompressThreads,
		DirectIO: pa.DirectIO, ReadaheadKB: pa.ReadaheadKB, TrustSnapshot: pa.TrustSnapshot, Remote: pa.Remote, Keys: keys,
		Logger: logger, directMount: true, memOnly: true})
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
	if err := st.Ready([]byte(tmp), fds); err != nil {
		return 1
	}
	st.Wait()
	return 0
}

// endWithStarter ends the helper if the starter ends (st.Wait returns)
// before the helper has set up (setUp closed): it cancels the setup, and
// if that does not return within privateExitWait, unmounts and removes
// the mountpoint (tmpDir, once made) and exits.
func endWithStarter(st *helper.Starter, setUp <-chan struct{}, cancel context.CancelFunc, tmpDir *atomic.Pointer[string]) {
	st.Wait()
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
}

// privateNamespace moves the calling thread, as root, into a mount
// namespace of its own, private, without the other lazyfs mounts. Without
// root it does nothing: the mount is in the shared namespace (see
// MountPrivate).
func privateNamespace() error {
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		return nil // not root
	}
	// Without it the mount would propagate to the shared parent.
	if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("private mount namespace: %w", err)
	}
	// The copies of the other lazyfs mounts go: an unmount outside
	// never reaches this private copy, which would keep their file
	// systems, and their servers, until this helper ends.
	detachLazyfs(unix.Gettid())
	return nil
}
