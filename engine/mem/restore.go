package mem

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
)

// madvFlags maps smaps VmFlags to the madvise calls that set them.
var madvFlags = map[string]int{
	"dc": unix.MADV_DONTFORK,
	"wf": unix.MADV_WIPEONFORK,
	"nh": unix.MADV_NOHUGEPAGE,
	"hg": unix.MADV_HUGEPAGE,
	"dd": unix.MADV_DONTDUMP,
	"mg": unix.MADV_MERGEABLE,
	"sr": unix.MADV_SEQUENTIAL,
	"rr": unix.MADV_RANDOM,
}

// Injector is what the restore of memory asks of the process under
// restore, through its injector (a *syscalls.Injector): system calls run
// one at a time, and data put in its scratch memory for them.
type Injector interface {
	Call(nr int, args ...uint64) (uint64, error)
	CloseFD(fd int) error
	Put(off int, b []byte) (uint64, error)
	PutString(off int, s string) (uint64, error)
}

// batch is a batch of system calls in the making, run in one resume of
// the process once complete (a *syscalls.Calls).
type batch interface {
	// Add appends system call nr with args; what names it in an error.
	Add(what string, nr int, args ...uint64)
	// Len returns how many calls the batch holds.
	Len() int
	// What returns what call i is for.
	What(i int) string
	// Result returns the raw result of call i once it ran.
	Result(i int) int64
}

// Target is the process under restore: injected calls reach it, and it
// becomes the process of State.
type Target struct {
	In    *syscalls.Injector
	State *image.Process
	Log   *slog.Logger
	// Tree, for a process of a tree, hands out the shared memory
	// objects it maps with other processes (ShmemRef.Tree).
	Tree fds.Tree
	// SysV are the System V segments of the restore, shared by the
	// processes of a tree: the first to attach one makes it (sysv.go).
	SysV *SysVSegments
	// Inherit, for a process forked from its restored parent, are the
	// VMAs it keeps from it and the pages in them that stay shared.
	Inherit Inheritance
	// Ghosts are the deleted files Map made again for the private
	// mappings of them (VMA.Ghost), by device and inode: their
	// descriptors in the process, which the caller closes (the
	// program's, if it was deleted, is its exe: task.SetMM).
	Ghosts map[[2]uint64]int
	// Foreign: the files are in a container's root (restore --into),
	// matched by size and mtime (fds.Match.Foreign).
	Foreign bool
}

// inherited reports whether v is a VMA the process keeps from its parent.
func (t *Target) inherited(v *image.VMA) bool {
	return Within(t.Inherit.VMAs, v.Start, v.End-v.Start)
}

// pid is the process's pid in our pid namespace (not State.PID when it
// was restored into another).
func (t *Target) pid() int { return t.In.Thread().Process().Pid() }

func (t *Target) closeFD(fd int) {
	if err := t.In.CloseFD(fd); err != nil {
		t.Log.Warn("close in restored process", "fd", fd, "err", err)
	}
}

// Map maps every VMA of the snapshot at its address, with its advice
// (madvise). It returns the shared memory objects it created (object id
// to their descriptor in the process), which descriptors may share: the
// caller closes them once the descriptors are restored (fds.Restore
// does).
func Map(ctx context.Context, t *Target) (shmem map[uint64]int, err error) {
	m := &mapper{Target: t, in: t.In, files: map[string]int{}, shmem: map[uint64]int{}}
	defer func() {
		for _, fd := range m.files {
			t.closeFD(fd)
		}
		if err != nil {
			for _, fd := range m.shmem {
				t.closeFD(fd)
			}
		}
	}()
	// The mapped files are opened first, in a few batches, and the shared
	// objects one call at a time; every mmap, mprotect and madvise then
	// runs in one batch: a process with hundreds of mappings is mapped in
	// a few resumes.
	vmas := t.State.VMAs
	if err := m.openFiles(vmas); err != nil {
		return nil, err
	}
	calls := t.In.NewCalls()
	m.calls = calls
	if err := m.mapAll(ctx, vmas); err != nil {
		return nil, err
	}
	err = t.In.RunCalls(calls)
	m.files = nil // every call ran, whatever one returned
	if err != nil {
		return nil, err
	}
	if err := m.checkAddrs(); err != nil {
		return nil, err
	}
	return m.shmem, nil
}

// mapAll adds to the batch the mmap (or shmat) of every VMA of vmas but
// the inherited ones, their mprotects and madvises, and the close of the
// files opened to map; it makes the shared objects they need on the way.
func (r *mapper) mapAll(ctx context.Context, vmas []image.VMA) error {
	for i := 0; i < len(vmas); {
		if err := ctx.Err(); err != nil {
			return err
		}
		if r.inherited(&vmas[i]) {
			// In place since fork, its shared pages in it.
			r.advise(&vmas[i])
			i++
			continue
		}
		n := anonRun(vmas[i:], r.inherited)
		if err := r.mapRun(vmas[i : i+n]); err != nil {
			return err
		}
		for j := i; j < i+n; j++ {
			r.advise(&vmas[j])
		}
		i += n
	}
	// The files are closed in the same batch, once mapped.
	for key, fd := range r.files {
		r.calls.Add("close "+key, unix.SYS_CLOSE, uint64(fd))
	}
	return nil
}

// checkAddrs checks, once the batch ran, that every mmap and shmat put
// its mapping where it was asked to.
func (r *mapper) checkAddrs() error {
	for _, mm := range r.mmaps {
		if got := uint64(r.calls.Result(mm.call)); got != mm.addr {
			return fmt.Errorf("%s: mapped at %#x", r.calls.What(mm.call), got)
		}
	}
	return nil
}

// anonRun returns how many VMAs from vmas[0] on one mmap can map: 1, or
// a run of contiguous unnamed anonymous private VMAs, none inherited, that differ only in
// what madvise sets. Mapped one by one they would merge into one VMA
// anyway, for madvise to split again: a process whose allocator advises
// its large allocations (MADV_HUGEPAGE on every numpy array) has
// hundreds of them, each mmap an injected call.
func anonRun(vmas []image.VMA, inherited func(*image.VMA) bool) int {
	mergeable := func(v *image.VMA) bool {
		return v.Kind == image.VMAAnon && v.Name == "" && v.Flags&(unix.MAP_SHARED|unix.MAP_GROWSDOWN) == 0 &&
			v.Flags&unix.MAP_PRIVATE != 0 && !reprotected(v) && !inherited(v)
	}
	n := 1
	if !mergeable(&vmas[0]) {
		return n
	}
	nr := slices.Contains(vmas[0].VMFlags, "nr")
	for n < len(vmas) {
		v, prev := &vmas[n], &vmas[n-1]
		if v.Start != prev.End || !mergeable(v) || v.Prot != vmas[0].Prot || v.Flags != vmas[0].Flags || slices.Contains(v.VMFlags, "nr") != nr {
			break
		}
		n++
	}
	return n
}

// mapRun maps the VMAs of run (one, or what anonRun found) with one mmap.
// A single VMA is passed on as itself: mapVMA tells a shared object's
// mappings apart by address in State.
func (r *mapper) mapRun(run []image.VMA) error {
	v := &run[0]
	if len(run) > 1 {
		whole := *v
		whole.End = run[len(run)-1].End
		v = &whole
	}
	if err := r.mapVMA(v); err != nil {
		return fmt.Errorf("map %x-%x %s %s: %w", v.Start, v.End, image.Perms(*v), v.Name, err)
	}
	return nil
}

// reprotected reports whether mapVMA maps v writable, then takes write
// away: a private mapping that was writable once (a RELRO segment made
// read-only after relocation) is accounted ("ac").
func reprotected(v *image.VMA) bool {
	return v.Flags&unix.MAP_PRIVATE != 0 && v.Prot&unix.PROT_WRITE == 0 && slices.Contains(v.VMFlags, "ac")
}

// mapper is one Map.
type mapper struct {
	*Target
	in    Injector       // Target.In
	files map[string]int // mode:path -> fd of a mapped file in the process
	shmem map[uint64]int
	calls batch // the mmaps, mprotects and madvises, run at the end
	mmaps []mmapCall
}

// mmapCall is an mmap of a batch and the address it must return.
type mmapCall struct {
	call int
	addr uint64
}

// advise gives mapped VMA v its advice.
func (r *mapper) advise(v *image.VMA) {
	for _, f := range v.VMFlags {
		if adv, ok := madvFlags[f]; ok {
			r.calls.Add(fmt.Sprintf("madvise %x-%x %s", v.Start, v.End, f), unix.SYS_MADVISE, v.Start, v.End-v.Start, uint64(adv))
		}
	}
}

func (r *mapper) mapVMA(v *image.VMA) error {
	length := v.End - v.Start
	prot := uint64(v.Prot)
	flags := uint64(unix.MAP_FIXED_NOREPLACE) | uint64(v.Flags&(unix.MAP_SHARED|unix.MAP_PRIVATE|unix.MAP_GROWSDOWN))
	if slices.Contains(v.VMFlags, "nr") {
		flags |= unix.MAP_NORESERVE
	}
	// A private mapping that was writable once (a RELRO segment made
	// read-only after relocation) is accounted ("ac"): map it writable
	// so that it is accounted too, then take write away. Without the
	// flag it would merge with the read-only mapping before it.
	reprotect := reprotected(v)
	if reprotect {
		prot |= unix.PROT_WRITE
	}
	fd, off := ^uint64(0), uint64(0)
	switch v.Kind {
	case image.VMAVDSO, image.VMAVVar, image.VMAVVarVclock, image.VMAVsyscall:
		return nil
	case image.VMAAnon:
		flags |= unix.MAP_ANONYMOUS
	case image.VMAFile, image.VMAFileShared:
		mode, key := fileMode(v)
		f, ok := r.files[key]
		if v.Ghost != nil {
			var err error
			if f, err = r.ghost(v); err != nil {
				return err
			}
			ok = true
		}
		if !ok {
			var err error
			if f, err = fds.OpenVerified(r.In, v.File.Path, mode|unix.O_CLOEXEC, *v.File, fds.Match{Bytes: true, Foreign: r.Foreign}); err != nil {
				return err
			}
			r.files[key] = f
		}
		fd, off = uint64(f), v.Offset
	case image.VMAShmem:
		if v.Shmem != nil && v.Shmem.SysV != nil {
			return r.attachSysV(v)
		}
		if r.anonShared(v) {
			flags |= unix.MAP_ANONYMOUS
			break
		}
		f, err := r.shmemFD(v)
		if err != nil {
			return err
		}
		fd, off = uint64(f), v.Offset
	default:
		return fmt.Errorf("%w: VMA kind %q", image.ErrUnsupported, v.Kind)
	}
	what := fmt.Sprintf("map %x-%x %s %s", v.Start, v.End, image.Perms(*v), v.Name)
	r.mmaps = append(r.mmaps, mmapCall{r.calls.Len(), v.Start})
	r.calls.Add(what, unix.SYS_MMAP, v.Start, length, prot, flags, fd, off)
	if reprotect {
		r.calls.Add(what+": mprotect", unix.SYS_MPROTECT, v.Start, length, uint64(v.Prot))
	}
	return nil
}

// fileMode returns how file-backed VMA v's file is opened, and the key
// of that open in mapper.files. A shared mapping of a file open for
// writing may be made writable later ("mw", VM_MAYWRITE); the kernel
// grants that only to a mapping of a file opened read-write.
func fileMode(v *image.VMA) (mode int, key string) {
	mode = unix.O_RDONLY
	if v.Kind == image.VMAFileShared && (v.Prot&unix.PROT_WRITE != 0 || slices.Contains(v.VMFlags, "mw")) {
		mode = unix.O_RDWR
	}
	return mode, fmt.Sprintf("%d:%s", mode, v.File.Path)
}

// openFiles opens, in the process, every file a VMA of vmas maps (but
// the ghosts and what the process inherited), each checked to be the
// dumped file (fds.OpenVerifiedAll), into r.files.
func (r *mapper) openFiles(vmas []image.VMA) error {
	var files []fds.Verified
	var keys []string
	seen := map[string]bool{}
	for i := range vmas {
		v := &vmas[i]
		if v.Kind != image.VMAFile && v.Kind != image.VMAFileShared || v.Ghost != nil || r.inherited(v) {
			continue
		}
		mode, key := fileMode(v)
		if seen[key] {
			continue
		}
		seen[key] = true
		files = append(files, fds.Verified{Path: v.File.Path, Flags: mode | unix.O_CLOEXEC, ID: *v.File, Match: fds.Match{Bytes: true, Foreign: r.Foreign}})
		keys = append(keys, key)
	}
	got, err := fds.OpenVerifiedAll(r.In, files)
	if err != nil {
		return err
	}
	for i, fd := range got {
		r.files[keys[i]] = fd
	}
	return nil
}

// ghost returns the descriptor in the process of the deleted file v maps,
// making it the first time (fds.MakeGhost).
func (r *mapper) ghost(v *image.VMA) (int, error) {
	key := [2]uint64{v.File.Dev, v.File.Ino}
	if fd, ok := r.Ghosts[key]; ok {
		return fd, nil
	}
	fd, err := fds.MakeGhost(r.In, v.File.Path, v.Ghost)
	if err != nil {
		return -1, err
	}
	if r.Ghosts == nil {
		r.Ghosts = map[[2]uint64]int{}
	}
	r.Ghosts[key] = fd
	return fd, nil
}

// anonShared reports whether v is the only mapping of a shared anonymous
// object, which mmap(MAP_SHARED|MAP_ANONYMOUS) recreates as it was (other
// shared objects become memfds: several mappings of one object need a
// file to map it from).
func (r *mapper) anonShared(v *image.VMA) bool {
	if strings.HasPrefix(v.Name, "/memfd:") || v.Shmem == nil || v.Shmem.Tree || v.Offset != 0 || (v.Shmem.Size != 0 && v.Shmem.Size != v.End-v.Start) {
		return false
	}
	for i := range r.State.VMAs {
		w := &r.State.VMAs[i]
		if w != v && w.Shmem != nil && w.Shmem.ID == v.Shmem.ID {
			return false
		}
	}
	for _, f := range r.State.FDs {
		if f.File != nil && f.File.Ino == v.Shmem.ID {
			return false
		}
	}
	return true
}

// shmemFD returns an fd in the child for the shared object v maps,
// creating the object (a memfd of the dumped size) the first time.
func (r *mapper) shmemFD(v *image.VMA) (int, error) {
	if v.Shmem == nil {
		return -1, fmt.Errorf("%w: shared mapping without object", image.ErrCorrupt)
	}
	if fd, ok := r.shmem[v.Shmem.ID]; ok {
		return fd, nil
	}
	if v.Shmem.Tree {
		if r.Tree == nil {
			return -1, fmt.Errorf("%w: memory shared with other processes of a tree, restored alone", image.ErrCorrupt)
		}
		fd, ok, err := r.Tree.Take(r.In, fds.ShmemKey(v.Shmem.ID))
		if err != nil {
			return -1, err
		}
		if ok {
			r.shmem[v.Shmem.ID] = fd
			return fd, nil
		}
	}
	name := "lazyfs-shmem"
	if n, ok := strings.CutPrefix(v.Name, "/memfd:"); ok {
		name = strings.TrimSuffix(n, " (deleted)")
	}
	a, err := r.in.PutString(0, name)
	if err != nil {
		return -1, err
	}
	fd, err := r.in.Call(unix.SYS_MEMFD_CREATE, a, unix.MFD_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("memfd_create: %w", err)
	}
	size := v.Shmem.Size
	if size == 0 {
		size = v.Offset + v.End - v.Start
	}
	if _, err := r.in.Call(unix.SYS_FTRUNCATE, fd, size); err != nil {
		return -1, fmt.Errorf("ftruncate shared object to %d: %w", size, err)
	}
	r.shmem[v.Shmem.ID] = int(fd)
	if v.Shmem.Tree {
		if err := r.Tree.Give(r.pid(), fds.ShmemKey(v.Shmem.ID), int(fd)); err != nil {
			return -1, err
		}
	}
	return int(fd), nil
}

// VMAAt returns the VMA of vmas (sorted by address) holding addr, or nil.
func VMAAt(vmas []image.VMA, addr uint64) *image.VMA {
	i := sort.Search(len(vmas), func(i int) bool { return vmas[i].End > addr })
	if i < len(vmas) && vmas[i].Start <= addr {
		return &vmas[i]
	}
	return nil
}

// Lock mlocks the VMAs that were locked ("lo"; "lf" for
// MLOCK_ONFAULT), once their contents are in: locking populates the
// range, which before the fill would only fault in zero pages to
// overwrite.
func Lock(ctx context.Context, r *Target) error {
	return lock(r.In, r.State.VMAs)
}

// lock is Lock of vmas, through in.
func lock(in Injector, vmas []image.VMA) error {
	for _, v := range vmas {
		for _, f := range v.VMFlags {
			var err error
			switch f {
			case "lo":
				_, err = in.Call(unix.SYS_MLOCK, v.Start, v.End-v.Start)
			case "lf":
				_, err = in.Call(unix.SYS_MLOCK2, v.Start, v.End-v.Start, unix.MLOCK_ONFAULT)
			default:
				continue
			}
			if err != nil {
				return fmt.Errorf("mlock %x-%x: %w", v.Start, v.End, err)
			}
		}
	}
	return nil
}

// logger is the target's log, or the default one.
func (t *Target) logger() *slog.Logger {
	if t.Log != nil {
		return t.Log
	}
	return slog.Default()
}

// GhostOf reports whether file id, deleted, is kept in vmas (VMA.Ghost):
// a program deleted while it ran is made again for its mappings.
func GhostOf(vmas []image.VMA, id image.FileID) bool {
	for _, v := range vmas {
		if v.Ghost != nil && v.File != nil && v.File.Dev == id.Dev && v.File.Ino == id.Ino {
			return true
		}
	}
	return false
}
