package engine

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds"
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
		if err := r.child.WriteStub(a); err != nil {
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

func (r *restorer) closeFD(fd int) {
	if err := r.in.CloseFD(fd); err != nil {
		r.log.Warn("close in restored process", "fd", fd, "err", err)
	}
}

// setMM sets the mm fields, auxv and exe with PR_SET_MM_MAP. The old
// exe (the stub's) is unmapped already, as the kernel requires.
func (r *restorer) setMM(ctx context.Context) error {
	exeFD, err := fds.OpenVerified(r.in, r.st.Exe.Path, unix.O_RDONLY|unix.O_CLOEXEC, r.st.Exe, true)
	if err != nil {
		return err
	}
	defer r.closeFD(exeFD)
	return r.in.SetMM(ptrace.MM(r.st.MM), exeFD)
}
