package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
)

const (
	pageSize = image.PageSize
	// scratchLen is the scratch memory restore injects through: paths,
	// struct prctl_mm_map with auxv, sigactions, clone_args.
	scratchLen = 64 << 10
	areaLen    = pageSize + scratchLen
)

// atFDCWD is AT_FDCWD as a system call argument.
var atFDCWD = func() uint64 { v := int64(unix.AT_FDCWD); return uint64(v) }()

// stub is "syscall; int3" followed by int3 padding.
var stubCode = []byte{0x0f, 0x05, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc}

// createProcess starts a stub program stopped before its first
// instruction and clones the process out of it with its original pid.
func (r *restorer) createProcess(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	stub, err := r.t.StartStopped(exe, []string{"lazyfs-restore-stub"}, ptrace.StartOptions{Options: unix.PTRACE_O_EXITKILL})
	if err != nil {
		return fmt.Errorf("start stub: %w", err)
	}
	r.stub = stub
	in, err := stub.Leader().NewInjector(pageSize)
	if err != nil {
		return fmt.Errorf("stub: %w", err)
	}
	th, err := in.Clone3(ptrace.CloneArgs{ExitSignal: uint64(unix.SIGCHLD), SetTID: []int{r.st.PID}})
	if err != nil {
		in.Close()
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%w: pid %d was taken meanwhile", ErrPIDInUse, r.st.PID)
		}
		return fmt.Errorf("clone3 with pid %d: %w", r.st.PID, err)
	}
	r.child = th.Process()
	if th.Tid() != r.st.PID {
		return fmt.Errorf("clone3 made pid %d, wanted %d", th.Tid(), r.st.PID)
	}
	if err := th.SetOptions(unix.PTRACE_O_EXITKILL | unix.PTRACE_O_TRACECLONE); err != nil {
		return err
	}
	// The child's memory is a copy of the stub's, injector page included:
	// use it to map our own area where the restored layout leaves room.
	cin, err := th.InjectorAt(in.Stub(), 0, 0)
	if err != nil {
		return err
	}
	r.area, err = r.mapArea(cin)
	cin.Close()
	if err != nil {
		return err
	}
	r.in, err = th.InjectorAt(r.area, r.area+pageSize, scratchLen)
	if err != nil {
		return err
	}
	r.threads = []*ptrace.Thread{th}
	// The stub has done its work; the process is reparented to init.
	in.Close()
	if err := stub.Kill(); err != nil {
		return fmt.Errorf("kill stub: %w", err)
	}
	r.stub = nil
	return nil
}

// mapArea maps the injection area (stub page, scratch) at an address the
// restored layout does not use.
func (r *restorer) mapArea(in *ptrace.Injector) (uint64, error) {
	for _, a := range r.freeAreas(areaLen) {
		res, err := in.Syscall(unix.SYS_MMAP, a, areaLen, unix.PROT_READ|unix.PROT_WRITE|unix.PROT_EXEC,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED_NOREPLACE, ^uint64(0), 0)
		if err != nil {
			return 0, err
		}
		if res == -int64(unix.EEXIST) {
			continue
		}
		if res < 0 {
			return 0, fmt.Errorf("mmap injection area: %w", ptrace.Errno(res))
		}
		if err := r.child.WriteMem(a, stubCode); err != nil {
			return 0, err
		}
		return a, nil
	}
	return 0, errors.New("no room for the injection area in the restored layout")
}

// freeAreas lists candidate addresses for n bytes outside every dumped VMA.
func (r *restorer) freeAreas(n uint64) []uint64 {
	var out []uint64
	lo := uint64(1 << 32)
	vmas := r.st.VMAs
	for i := 0; i <= len(vmas) && len(out) < 16; i++ {
		hi := uint64(0x7ffffffff000)
		if i < len(vmas) {
			hi = vmas[i].Start
		}
		// keep a page of distance from stacks that grow down
		if hi > lo+n+2*pageSize {
			out = append(out, lo+pageSize)
		}
		if i < len(vmas) {
			lo = max(lo, vmas[i].End)
		}
	}
	return out
}

// unmapStub closes every descriptor the stub inherited and removes every
// mapping it left in the child but our area and the kernel's special
// mappings (moved next).
func (r *restorer) unmapStub(ctx context.Context) error {
	if _, err := r.call(unix.SYS_CLOSE_RANGE, 0, ^uint64(0)>>32, 0); err != nil {
		return fmt.Errorf("close_range: %w", err)
	}
	maps, err := proc.ReadMaps(r.st.PID)
	if err != nil {
		return err
	}
	for _, m := range maps {
		if m.Start == r.area || m.IsSpecial() {
			continue
		}
		if _, err := r.call(unix.SYS_MUNMAP, m.Start, m.Len()); err != nil {
			return fmt.Errorf("munmap %s: %w", m.String(), err)
		}
	}
	return nil
}

// call injects a system call into the leader and turns a failure into an
// error.
func (r *restorer) call(nr int, args ...uint64) (uint64, error) {
	return r.in.Call(nr, args...)
}

// moveVDSO moves [vvar], [vvar_vclock] and [vdso] where the process had
// them (same kernel: same sizes, same relative layout).
func (r *restorer) moveVDSO(ctx context.Context) error {
	maps, err := proc.ReadMaps(r.st.PID)
	if err != nil {
		return err
	}
	type move struct {
		name     string
		from, to uint64
		len      uint64
	}
	var moves []move
	for _, v := range r.st.VMAs {
		if v.Kind != image.VMAVDSO && v.Kind != image.VMAVVar && v.Kind != image.VMAVVarVclock {
			continue
		}
		found := false
		for _, m := range maps {
			if m.Path == v.Name {
				if m.Len() != v.End-v.Start {
					return fmt.Errorf("%w: %s is %d bytes here, %d in the snapshot", ErrKernelMismatch, v.Name, m.Len(), v.End-v.Start)
				}
				moves = append(moves, move{v.Name, m.Start, v.Start, m.Len()})
				found = true
			}
		}
		if !found {
			return fmt.Errorf("%w: no %s mapping here", ErrKernelMismatch, v.Name)
		}
	}
	// Unmap specials the snapshot did not have.
	for _, m := range maps {
		if m.IsSpecial() && m.Path != "[vsyscall]" && !hasVMA(r.st.VMAs, m.Path) {
			if _, err := r.call(unix.SYS_MUNMAP, m.Start, m.Len()); err != nil {
				return fmt.Errorf("munmap %s: %w", m.Path, err)
			}
		}
	}
	// If a target overlaps a current position, go through a free area.
	overlap := false
	for _, a := range moves {
		for _, b := range moves {
			if a.to < b.from+b.len && b.from < a.to+a.len && a.to != a.from {
				overlap = true
			}
		}
	}
	if overlap {
		var total uint64
		for _, m := range moves {
			total += m.len
		}
		tmp := r.freeAreas(total + areaLen)
		if len(tmp) == 0 {
			return errors.New("no room to move the vDSO through")
		}
		at := tmp[len(tmp)-1]
		for i := range moves {
			if err := r.mremap(moves[i].from, moves[i].len, at); err != nil {
				return fmt.Errorf("move %s: %w", moves[i].name, err)
			}
			moves[i].from = at
			at += moves[i].len
		}
	}
	for _, m := range moves {
		if m.from == m.to {
			continue
		}
		if err := r.mremap(m.from, m.len, m.to); err != nil {
			return fmt.Errorf("move %s to %#x: %w", m.name, m.to, err)
		}
	}
	return nil
}

func hasVMA(vmas []image.VMA, name string) bool {
	for _, v := range vmas {
		if v.Name == name {
			return true
		}
	}
	return false
}

func (r *restorer) mremap(from, n, to uint64) error {
	got, err := r.call(unix.SYS_MREMAP, from, n, n, unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED, to)
	if err == nil && got != to {
		err = fmt.Errorf("mremap moved to %#x", got)
	}
	return err
}

// putString writes a NUL-terminated string into scratch at off and
// returns its address.
func (r *restorer) putString(off int, s string) (uint64, error) {
	if off+len(s)+1 > scratchLen {
		return 0, fmt.Errorf("path of %d bytes does not fit the scratch area", len(s))
	}
	a := r.area + pageSize + uint64(off)
	return a, r.child.WriteMem(a, append([]byte(s), 0))
}

// open injects openat(AT_FDCWD, path, flags, mode) and returns the fd.
func (r *restorer) open(path string, flags int, mode uint32) (int, error) {
	a, err := r.putString(0, path)
	if err != nil {
		return -1, err
	}
	fd, err := r.call(unix.SYS_OPENAT, atFDCWD, a, uint64(flags), uint64(mode))
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", path, err)
	}
	return int(fd), nil
}

func (r *restorer) closeFD(fd int) {
	if _, err := r.call(unix.SYS_CLOSE, uint64(fd)); err != nil {
		r.log.Warn("close in restored process", "fd", fd, "err", err)
	}
}

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

// mapMemory maps every VMA of the snapshot at its address.
func (r *restorer) mapMemory(ctx context.Context) error {
	files := map[string]int{}
	defer func() {
		for _, fd := range files {
			r.closeFD(fd)
		}
	}()
	r.shmem = map[uint64]int{}
	for i := range r.st.VMAs {
		v := &r.st.VMAs[i]
		if err := r.mapVMA(v, files); err != nil {
			return fmt.Errorf("map %x-%x %s %s: %w", v.Start, v.End, image.Perms(*v), v.Name, err)
		}
		for _, f := range v.VMFlags {
			adv, ok := madvFlags[f]
			if !ok {
				continue
			}
			if _, err := r.call(unix.SYS_MADVISE, v.Start, v.End-v.Start, uint64(adv)); err != nil {
				return fmt.Errorf("madvise %x-%x %s: %w", v.Start, v.End, f, err)
			}
		}
	}
	return nil
}

func (r *restorer) mapVMA(v *image.VMA, files map[string]int) error {
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
	reprotect := v.Flags&unix.MAP_PRIVATE != 0 && v.Prot&unix.PROT_WRITE == 0 && slices.Contains(v.VMFlags, "ac")
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
		// A shared mapping of a file open for writing may be made
		// writable later ("mw", VM_MAYWRITE); the kernel grants that only
		// to a mapping of a file opened read-write.
		mode := unix.O_RDONLY
		if v.Kind == image.VMAFileShared && (v.Prot&unix.PROT_WRITE != 0 || slices.Contains(v.VMFlags, "mw")) {
			mode = unix.O_RDWR
		}
		key := fmt.Sprintf("%d:%s", mode, v.File.Path)
		f, ok := files[key]
		if !ok {
			var err error
			if f, err = r.open(v.File.Path, mode|unix.O_CLOEXEC, 0); err != nil {
				return err
			}
			files[key] = f
		}
		fd, off = uint64(f), v.Offset
	case image.VMAShmem:
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
		return fmt.Errorf("%w: VMA kind %q", ErrUnsupported, v.Kind)
	}
	got, err := r.call(unix.SYS_MMAP, v.Start, length, prot, flags, fd, off)
	if err != nil {
		return err
	}
	if got != v.Start {
		return fmt.Errorf("mapped at %#x", got)
	}
	if reprotect {
		if _, err := r.call(unix.SYS_MPROTECT, v.Start, length, uint64(v.Prot)); err != nil {
			return fmt.Errorf("mprotect: %w", err)
		}
	}
	return nil
}

// anonShared reports whether v is the only mapping of a shared anonymous
// object, which mmap(MAP_SHARED|MAP_ANONYMOUS) recreates as it was (other
// shared objects become memfds: several mappings of one object need a
// file to map it from).
func (r *restorer) anonShared(v *image.VMA) bool {
	if strings.HasPrefix(v.Name, "/memfd:") || v.Shmem == nil || v.Offset != 0 || (v.Shmem.Size != 0 && v.Shmem.Size != v.End-v.Start) {
		return false
	}
	for i := range r.st.VMAs {
		w := &r.st.VMAs[i]
		if w != v && w.Shmem != nil && w.Shmem.ID == v.Shmem.ID {
			return false
		}
	}
	for _, f := range r.st.FDs {
		if f.File != nil && f.File.Ino == v.Shmem.ID {
			return false
		}
	}
	return true
}

// shmemFD returns an fd in the child for the shared object v maps,
// creating the object (a memfd of the dumped size) the first time.
func (r *restorer) shmemFD(v *image.VMA) (int, error) {
	if v.Shmem == nil {
		return -1, fmt.Errorf("%w: shared mapping without object", image.ErrCorrupt)
	}
	if fd, ok := r.shmem[v.Shmem.ID]; ok {
		return fd, nil
	}
	name := "lazyfs-shmem"
	if n, ok := strings.CutPrefix(v.Name, "/memfd:"); ok {
		name = strings.TrimSuffix(n, " (deleted)")
	}
	a, err := r.putString(0, name)
	if err != nil {
		return -1, err
	}
	fd, err := r.call(unix.SYS_MEMFD_CREATE, a, unix.MFD_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("memfd_create: %w", err)
	}
	size := v.Shmem.Size
	if size == 0 {
		size = v.Offset + v.End - v.Start
	}
	if _, err := r.call(unix.SYS_FTRUNCATE, fd, size); err != nil {
		return -1, fmt.Errorf("ftruncate shared object to %d: %w", size, err)
	}
	r.shmem[v.Shmem.ID] = int(fd)
	return int(fd), nil
}

// vmaAt returns the VMA holding addr.
func (r *restorer) vmaAt(addr uint64) *image.VMA {
	vmas := r.st.VMAs
	i := sort.Search(len(vmas), func(i int) bool { return vmas[i].End > addr })
	if i < len(vmas) && vmas[i].Start <= addr {
		return &vmas[i]
	}
	return nil
}

// lockMemory mlocks the VMAs that were locked ("lo"; "lf" for
// MLOCK_ONFAULT), once their contents are in: locking populates the
// range, which before the fill would only fault in zero pages to
// overwrite.
func (r *restorer) lockMemory(ctx context.Context) error {
	for _, v := range r.st.VMAs {
		for _, f := range v.VMFlags {
			var err error
			switch f {
			case "lo":
				_, err = r.call(unix.SYS_MLOCK, v.Start, v.End-v.Start)
			case "lf":
				_, err = r.call(unix.SYS_MLOCK2, v.Start, v.End-v.Start, unix.MLOCK_ONFAULT)
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

// setMM sets the mm fields, auxv and exe with PR_SET_MM_MAP. The old
// exe (the stub's) is unmapped already, as the kernel requires.
func (r *restorer) setMM(ctx context.Context) error {
	exeFD, err := r.open(r.st.Exe.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer r.closeFD(exeFD)
	return r.in.SetMM(ptrace.MM(r.st.MM), exeFD)
}
