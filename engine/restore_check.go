package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/uffd"
)

// restorer holds the state of one restore.
type restorer struct {
	snap  *image.Snapshot
	st    *image.Process
	pages *image.Reader
	opts  RestoreOptions
	log   *slog.Logger
	t     *ptrace.Tracer

	stub  *ptrace.Process // the exec'd stub the process is cloned from
	child *ptrace.Process // the restored process
	in    *ptrace.Injector
	area  uint64 // our stub page and scratch in the child
	// threads are the restored threads, in the order of st.Threads.
	threads []*ptrace.Thread
	// shmem maps a shared object id to the fd of it in the child while
	// memory is mapped and fds restored.
	shmem  map[uint64]int
	filled uint64
	// running is set once the process runs (detached, for an eager
	// restore).
	running bool
	lazy    *lazyState
}

// restoreFDs recreates every descriptor (engine/fds) and closes the
// shared memory objects that mapping memory left open for them.
func (r *restorer) restoreFDs(ctx context.Context) error {
	err := fds.Restore(ctx, r.in, r.st, r.shmem, r.log)
	r.shmem = nil
	return err
}

// check refuses, before anything is created, a snapshot this machine or
// build cannot restore.
func (r *restorer) check() error {
	st := r.st
	k := r.snap.Manifest.Kernel
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return err
	}
	if rel := unix.ByteSliceToString(u.Release[:]); k.Release != rel || k.Machine != unix.ByteSliceToString(u.Machine[:]) {
		return fmt.Errorf("%w: dumped on %s %s, this is %s: the vDSO would not match", ErrKernelMismatch, k.Release, k.Machine, rel)
	}
	if busy, comm := pidInUse(st.PID); busy {
		return fmt.Errorf("%w: pid %d is taken by %q", ErrPIDInUse, st.PID, comm)
	}
	for _, th := range st.Threads {
		if busy, comm := pidInUse(th.TID); busy {
			return fmt.Errorf("%w: thread id %d is taken by %q", ErrPIDInUse, th.TID, comm)
		}
	}
	if len(st.Threads) == 0 || st.Threads[0].TID != st.PID {
		return fmt.Errorf("%w: the first thread is not the process leader", image.ErrCorrupt)
	}
	if err := fds.CheckFile(st.Exe, "executable"); err != nil {
		return err
	}
	for _, v := range st.VMAs {
		if v.File != nil && (v.Kind == image.VMAFile || v.Kind == image.VMAFileShared) {
			if err := fds.CheckFile(*v.File, fmt.Sprintf("mapping %x-%x", v.Start, v.End)); err != nil {
				return err
			}
		}
	}
	for _, f := range st.FDs {
		if err := fds.Check(f); err != nil {
			return fmt.Errorf("fd %d: %w", f.FD, err)
		}
	}
	return nil
}

// Feature is a kernel facility (or a tool) that restore needs, as
// CheckFeatures found it on this machine.
type Feature struct {
	Name   string `json:"name"`
	Needed string `json:"needed"` // what needs it
	OK     bool   `json:"ok"`
	Detail string `json:"detail"` // what was tried and seen, or why it is missing
}

// CheckFeatures tries every kernel facility restore needs, for real:
// ptrace (a stub started stopped, seized, interrupted and injected into),
// clone3 with set_tid (a process made with a chosen free pid and killed),
// PR_SET_MM_MAP (the size query and a call with the stub's own values),
// userfaultfd (the features lazy restore and incremental dumps need, and
// an anonymous range registered MISSING), PAGEMAP_SCAN on
// /proc/self/pagemap, and FUSE (/dev/fuse, and fusermount3 or fusermount
// on PATH). stub is the
// program started stopped (it never runs an instruction); "" means this
// executable.
func CheckFeatures(ctx context.Context, stub string) []Feature {
	out := checkTracing(ctx, stub)
	return append(out, checkUserfaultfd()...)
}

// What needs each feature.
const (
	neededRestore = "restore"
	neededLazy    = "restore --lazy"
	neededIncr    = "incremental dump"
	neededMount   = "lazyfs, restore --lazy"
)

func feature(name, needed string, err error, detail string) Feature {
	if err != nil {
		return Feature{Name: name, Needed: needed, Detail: err.Error()}
	}
	return Feature{Name: name, Needed: needed, OK: true, Detail: detail}
}

// checkTracing checks ptrace, clone3 with set_tid and PR_SET_MM_MAP in a
// stub.
func checkTracing(ctx context.Context, stub string) []Feature {
	names := []string{"ptrace", "clone3 set_tid", "PR_SET_MM_MAP"}
	fail := func(i int, err error) []Feature {
		var out []Feature
		for j, n := range names {
			if j < i {
				continue
			}
			if j > i {
				err = fmt.Errorf("not tried: needs %s", names[i])
			}
			out = append(out, feature(n, neededRestore, err, ""))
		}
		return out
	}
	if stub == "" {
		var err error
		if stub, err = os.Executable(); err != nil {
			return fail(0, err)
		}
	}
	t, err := ptrace.New()
	if err != nil {
		return fail(0, err)
	}
	defer t.Close()
	p, err := t.StartStopped(stub, []string{"lazyfs-check-stub"}, ptrace.StartOptions{Options: unix.PTRACE_O_EXITKILL})
	if err != nil {
		if b, rerr := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); rerr == nil {
			err = fmt.Errorf("%w (kernel.yama.ptrace_scope=%s)", err, strings.TrimSpace(string(b)))
		}
		return fail(0, err)
	}
	defer p.Kill()
	in, err := p.Leader().NewInjector(pageSize)
	if err == nil {
		var pid uint64
		if pid, err = in.Call(unix.SYS_GETPID); err == nil && int(pid) != p.Pid() {
			err = fmt.Errorf("injected getpid returned %d in pid %d", pid, p.Pid())
		}
	}
	if err != nil {
		return fail(0, fmt.Errorf("inject into a seized stub: %w", err))
	}
	defer in.Close()
	out := []Feature{feature("ptrace", neededRestore, nil,
		fmt.Sprintf("started pid %d stopped, seized, interrupted, injected getpid", p.Pid()))}

	pid, err := cloneFreePID(ctx, in)
	out = append(out, feature("clone3 set_tid", neededRestore, err, fmt.Sprintf("made pid %d on request", pid)))

	err = checkMMMap(in, p)
	return append(out, feature("PR_SET_MM_MAP", neededRestore, err, "set a stub's mm fields and auxv to their own values"))
}

// cloneFreePID clones a process with a free pid out of the stub, and
// kills it.
func cloneFreePID(ctx context.Context, in *ptrace.Injector) (int, error) {
	var err error
	for range 3 {
		pid, ferr := freePID()
		if ferr != nil {
			return 0, ferr
		}
		var th *ptrace.Thread
		th, err = in.Clone3(ptrace.CloneArgs{ExitSignal: uint64(unix.SIGCHLD), SetTID: []int{pid}})
		if errors.Is(err, unix.EEXIST) {
			continue // taken meanwhile
		}
		if err != nil {
			if errors.Is(err, unix.EPERM) {
				err = fmt.Errorf("%w (needs CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN)", err)
			}
			return 0, err
		}
		if kerr := th.Process().Kill(); kerr != nil {
			return 0, fmt.Errorf("kill the clone: %w", kerr)
		}
		if th.Tid() != pid {
			return 0, fmt.Errorf("asked for pid %d, got %d", pid, th.Tid())
		}
		return pid, nil
	}
	return 0, err
}

// freePID returns a pid no process holds, well away from the next one
// the kernel hands out.
func freePID() (int, error) {
	read := func(name string) (int, error) {
		b, err := os.ReadFile("/proc/sys/kernel/" + name)
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(strings.TrimSpace(string(b)))
	}
	last, err := read("ns_last_pid")
	if err != nil {
		return 0, err
	}
	pidMax, err := read("pid_max")
	if err != nil {
		return 0, err
	}
	const low = 300 // where the kernel starts again after pid_max
	if pidMax <= low+2000 {
		return 0, fmt.Errorf("pid_max %d too small", pidMax)
	}
	for i := range pidMax - low {
		pid := low + (last-low+1000+i)%(pidMax-low)
		if busy, _ := pidInUseNow(pid); !busy {
			return pid, nil
		}
	}
	return 0, errors.New("no free pid")
}

// pidInUseNow reports whether a task holds id, zombies included.
func pidInUseNow(id int) (bool, error) {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", id))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return true, err
}

// checkMMMap asks for the size of struct prctl_mm_map and sets the stub's
// mm fields and auxv to the values they have.
func checkMMMap(in *ptrace.Injector, p *ptrace.Process) error {
	scratch, n := in.Scratch()
	if _, err := in.Call(unix.SYS_PRCTL, unix.PR_SET_MM, unix.PR_SET_MM_MAP_SIZE, scratch); err != nil {
		return fmt.Errorf("PR_SET_MM_MAP_SIZE: %w", err)
	}
	var b [4]byte
	if err := p.ReadMem(scratch, b[:]); err != nil {
		return err
	}
	if size := binary.LittleEndian.Uint32(b[:]); size != mmMapSize {
		return fmt.Errorf("struct prctl_mm_map is %d bytes here, restore writes %d", size, mmMapSize)
	}
	st, err := proc.ReadStat(p.Pid())
	if err != nil {
		return err
	}
	auxv, err := proc.ReadAuxv(p.Pid())
	if err != nil {
		return err
	}
	brk, err := in.Brk()
	if err != nil {
		return err
	}
	mm := image.MM{StartCode: st.StartCode, EndCode: st.EndCode, StartData: st.StartData, EndData: st.EndData,
		StartBrk: st.StartBrk, Brk: brk, StartStack: st.StartStack, ArgStart: st.ArgStart, ArgEnd: st.ArgEnd,
		EnvStart: st.EnvStart, EnvEnd: st.EnvEnd, Auxv: auxv}
	return setMMMap(in, p, scratch, n, mm, -1)
}

// checkUserfaultfd checks userfaultfd, PAGEMAP_SCAN and FUSE.
func checkUserfaultfd() []Feature {
	var out []Feature
	supported, err := uffdFeatures()
	var detail string
	if err == nil {
		if miss := uffd.RequiredFeatures &^ supported; miss != 0 {
			err = fmt.Errorf("UFFDIO_API lacks features %#x (fork, remap, remove and unmap events)", miss)
		}
	}
	if err == nil {
		detail, err = uffdRegisterMissing()
	}
	out = append(out, feature("userfaultfd", neededLazy, err, detail))
	if err == nil && supported&uffd.FeatureWPAsync == 0 {
		err = errors.New("UFFDIO_API lacks WP_ASYNC (Linux 6.7)")
	}
	out = append(out, feature("uffd WP_ASYNC", neededIncr, err, fmt.Sprintf("UFFDIO_API features %#x", supported)))
	out = append(out, checkPagemapScan())
	return append(out, checkFUSE())
}

func newUffd() (int, error) {
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if e != 0 {
		if e == unix.EPERM {
			return -1, fmt.Errorf("userfaultfd: %w (vm.unprivileged_userfaultfd=0 and no CAP_SYS_PTRACE)", e)
		}
		return -1, fmt.Errorf("userfaultfd: %w", e)
	}
	return int(fd), nil
}

// uffdFeatures returns the features UFFDIO_API offers.
func uffdFeatures() (uint64, error) {
	fd, err := newUffd()
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	supported, _, err := uffd.API(fd, 0)
	return supported, err
}

// uffdRegisterMissing registers an anonymous page of ours in MISSING mode
// with the features lazy restore asks for.
func uffdRegisterMissing() (string, error) {
	fd, err := newUffd()
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	if _, _, err := uffd.API(fd, uffd.Features); err != nil {
		return "", err
	}
	page, err := unix.Mmap(-1, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return "", err
	}
	defer unix.Munmap(page)
	addr := uint64(uintptr(unsafe.Pointer(&page[0])))
	ioctls, err := uffd.Register(fd, addr, pageSize, uffd.RegisterModeMissing)
	if err != nil {
		return "", err
	}
	if err := uffd.Unregister(fd, addr, pageSize); err != nil {
		return "", err
	}
	if ioctls&uffd.IoctlCopy == 0 {
		return "", fmt.Errorf("UFFDIO_COPY not allowed on a MISSING range (ioctls %#x)", ioctls)
	}
	return "registered an anonymous range MISSING; UFFDIO_COPY allowed", nil
}

// checkPagemapScan scans a page of ours with PAGEMAP_SCAN.
func checkPagemapScan() Feature {
	const name = "PAGEMAP_SCAN"
	pm, err := proc.OpenPagemap(os.Getpid())
	if err != nil {
		return feature(name, neededIncr, err, "")
	}
	defer pm.Close()
	if !pm.ScanSupported() {
		return feature(name, neededIncr, errors.New("ioctl on /proc/self/pagemap refused (Linux 6.7)"), "")
	}
	page, err := unix.Mmap(-1, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return feature(name, neededIncr, err, "")
	}
	defer unix.Munmap(page)
	page[0] = 1
	addr := uint64(uintptr(unsafe.Pointer(&page[0])))
	runs, err := pm.RunsScan(proc.Query{Start: addr, End: addr + pageSize, Require: proc.PagePresent}, nil)
	if err == nil && (len(runs) != 1 || runs[0].Start != addr) {
		err = fmt.Errorf("a present page scanned as %v", runs)
	}
	return feature(name, neededIncr, err, "found a page of ours present")
}

// checkFUSE checks that /dev/fuse opens and fusermount3 is on PATH.
func checkFUSE() Feature {
	const name = "FUSE"
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return feature(name, neededMount, fmt.Errorf("open /dev/fuse: %w", err), "")
	}
	unix.Close(fd)
	path, err := exec.LookPath("fusermount3")
	if err != nil {
		if path, err = exec.LookPath("fusermount"); err != nil {
			return feature(name, neededMount, errors.New("fusermount3 not on PATH (install fuse3)"), "")
		}
	}
	return feature(name, neededMount, nil, "/dev/fuse opens; "+path)
}
