package image

import (
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"
)

// Limits of a process state that Validate enforces: the kernel's own
// ceilings, which no tuning goes past, so that a state over them is
// damaged, never a process that could have been on a tuned host. A
// process has fewer threads than PID_MAX_LIMIT (4M, pid_max's ceiling:
// each takes a pid); a descriptor is below
// fs.nr_open's ceiling (INT_MAX rounded down to a multiple of 64; 1<<20 by
// default). vm.max_map_count may be raised to INT_MAX, but the largest
// state file (maxStateSize) describes about 1.5M VMAs: 1<<20 of them,
// 16 times the default count, are held to.
const (
	maxVMAs    = 1 << 20
	maxThreads = 1 << 22
	maxFD      = 1<<31 - 64
	// protMask is PROT_READ|PROT_WRITE|PROT_EXEC.
	protMask = 0x7
	// maxSemaphores is the kernel's ceiling of a set's semaphores
	// (SEMMSL's), semValueMax a semaphore's (SEMVMX).
	maxSemaphores = 32000
	semValueMax   = 32767
)

// Validate checks what a process state must be for a restore to take it:
// a positive pid; threads, the first of them the leader, each tid positive
// and once; VMAs page-aligned, non-empty, in address order and not
// overlapping, of a known kind, with PROT_* bits only; descriptors
// non-negative and once each, a dup (SameAs) naming a lower one that
// exists. State calls it, so that verify, inspect, a mount and a restore
// all refuse the same states, with ErrCorrupt, and a state verify passes
// is never refused by restore for its shape. (Whether this machine can
// restore it, its files and pids, is restore's own check.)
func (p *Process) Validate() error {
	if p.PID <= 0 {
		return bad("pid %d", p.PID)
	}
	if err := p.validateThreads(); err != nil {
		return err
	}
	if a := p.OOMScoreAdj; a != nil && (*a < -1000 || *a > 1000) {
		return bad("oom_score_adj %d, not within -1000 to 1000", *a)
	}
	if ipc := p.SysVIPC; ipc != nil {
		if err := ipc.validate(); err != nil {
			return err
		}
	}
	if err := p.validateVMAs(); err != nil {
		return err
	}
	if err := p.validateZombies(); err != nil {
		return err
	}
	return p.validateFDs()
}

// validateZombies checks the unreaped children: each pid positive, once,
// neither the process's own nor one of its threads', and a status wait
// could report of a process that ended (an exit code, or a signal from 1
// to 64).
func (p *Process) validateZombies() error {
	if len(p.Zombies) > maxThreads {
		return bad("%d unreaped children, more than %d", len(p.Zombies), maxThreads)
	}
	seen := make(map[int]bool, len(p.Zombies))
	for _, th := range p.Threads {
		seen[th.TID] = true
	}
	for _, z := range p.Zombies {
		if z.PID <= 0 || seen[z.PID] {
			return bad("unreaped child pid %d", z.PID)
		}
		seen[z.PID] = true
		if len(z.NSPID) > 0 && (z.NSPID[0] != z.PID || len(z.NSPID) != len(p.NSPID) || slices.ContainsFunc(z.NSPID, func(id int) bool { return id <= 0 })) {
			return bad("unreaped child %d: pids %v in the namespaces of a process with %v", z.PID, z.NSPID, p.NSPID)
		}
		if sig := z.Status & 0x7f; z.Status < 0 || z.Status > 0xffff || sig == 0x7f || (sig != 0 && z.Status&^0xff != 0) || (sig == 0 && z.Status&0xff != 0) || sig > 64 {
			return bad("unreaped child %d: status %#x is not one of a process that ended", z.PID, z.Status)
		}
		if sig := unix.Signal(z.Status & 0x7f); sig != 0 && !killsByDefault(sig) {
			return bad("unreaped child %d: killed by %v, a signal that does not kill", z.PID, sig)
		}
	}
	return nil
}

// killsByDefault reports whether sig's default action ends a process.
func killsByDefault(sig unix.Signal) bool {
	switch sig {
	case unix.SIGCHLD, unix.SIGCONT, unix.SIGSTOP, unix.SIGTSTP, unix.SIGTTIN, unix.SIGTTOU, unix.SIGURG, unix.SIGWINCH:
		return false
	}
	return true
}

// bad is a state Validate refuses: ErrCorrupt, saying why.
func bad(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// validateThreads checks the threads: the first the leader, each tid
// positive and once, their scheduling.
func (p *Process) validateThreads() error {
	if len(p.Threads) == 0 {
		return bad("no threads")
	}
	if len(p.Threads) > maxThreads {
		return bad("%d threads, more than %d", len(p.Threads), maxThreads)
	}
	if p.Threads[0].TID != p.PID {
		return bad("the first thread (tid %d) is not the process leader (pid %d)", p.Threads[0].TID, p.PID)
	}
	tids := make(map[int]bool, len(p.Threads))
	for _, th := range p.Threads {
		if th.TID <= 0 || tids[th.TID] {
			return bad("thread id %d: not positive, or twice", th.TID)
		}
		tids[th.TID] = true
		if err := th.Sched.validate(); err != nil {
			return bad("thread %d: %v", th.TID, err)
		}
	}
	return nil
}

// validate checks System V semaphore sets and message queues.
func (ipc *SysVIPC) validate() error {
	for _, s := range ipc.Sems {
		if s.ID < 0 || s.Mode > 0o777 || len(s.Values) == 0 || len(s.Values) > maxSemaphores {
			return bad("semaphore set %d (key %#x): id, mode %o or %d semaphores out of range", s.ID, uint32(s.Key), s.Mode, len(s.Values))
		}
		for i, v := range s.Values {
			if v > semValueMax {
				return bad("semaphore set %d: semaphore %d is %d, more than %d", s.ID, i, v, semValueMax)
			}
		}
	}
	for _, q := range ipc.Msgs {
		if q.ID < 0 || q.Mode > 0o777 {
			return bad("message queue %d (key %#x): id or mode %o out of range", q.ID, uint32(q.Key), q.Mode)
		}
		for _, m := range q.Messages {
			if m.Type <= 0 {
				return bad("message queue %d: a message of type %d (types are positive)", q.ID, m.Type)
			}
		}
	}
	return nil
}

// validateVMAs checks the VMAs: each valid, in address order, not
// overlapping, the contents of a deleted file mapped kept once.
func (p *Process) validateVMAs() error {
	if len(p.VMAs) > maxVMAs {
		return bad("%d VMAs, more than %d", len(p.VMAs), maxVMAs)
	}
	ghosts := map[[2]uint64]bool{}
	for i, v := range p.VMAs {
		if g := v.Ghost; g != nil {
			if v.Kind != VMAFile || v.File == nil || g.Mode > 0o7777 || g.Of != nil {
				return bad("VMA %d (%#x-%#x): a deleted file mapped that is not a private file mapping", i, v.Start, v.End)
			}
			key := [2]uint64{v.File.Dev, v.File.Ino}
			if ghosts[key] && len(g.Data) > 0 {
				return bad("VMA %d (%#x-%#x): the contents of deleted file %s twice", i, v.Start, v.End, v.File.Path)
			}
			ghosts[key] = true
		}
		if err := v.validate(); err != nil {
			return bad("VMA %d (%#x-%#x): %v", i, v.Start, v.End, err)
		}
		if i > 0 && v.Start < p.VMAs[i-1].End {
			return bad("VMA %d (%#x-%#x) is not after VMA %d (%#x-%#x): out of order or overlapping", i, v.Start, v.End, i-1, p.VMAs[i-1].Start, p.VMAs[i-1].End)
		}
	}
	return nil
}

// validateFDs checks the descriptors: each non-negative and once, a dup
// naming a lower one, deleted files, pseudo-terminals and locks.
func (p *Process) validateFDs() error {
	fds := make(map[int]bool, len(p.FDs))
	for _, f := range p.FDs {
		if f.FD < 0 || f.FD >= maxFD || fds[f.FD] {
			return bad("descriptor %d: negative, too high, or twice", f.FD)
		}
		fds[f.FD] = true
	}
	for _, f := range p.FDs {
		if f.SameAs != nil && (*f.SameAs >= f.FD || !fds[*f.SameAs]) {
			return bad("descriptor %d is a dup of %d, which is not a lower descriptor of the process", f.FD, *f.SameAs)
		}
		if g := f.Ghost; g != nil && !p.validGhostFD(&f, g) {
			return bad("descriptor %d: a deleted file that is not one (%s, mode %o, of %v)", f.FD, f.Kind, g.Mode, g.Of)
		}
		if pt := f.Pty; pt != nil && (f.Kind != FDChr || pt.Index < 0 || pt.State != nil && !pt.Master) {
			return bad("descriptor %d: a pseudo-terminal end that is not one (%s, pair %d)", f.FD, f.Kind, pt.Index)
		}
		for _, l := range f.Locks {
			if l.Kind != LockFlock && l.Kind != LockPOSIX && l.Kind != LockOFD || l.Start < 0 || l.End < -1 || l.End >= 0 && l.End < l.Start {
				return bad("descriptor %d: lock %+v", f.FD, l)
			}
		}
	}
	return nil
}

// validGhostFD reports whether descriptor f's deleted file g is one: a
// regular file's, its contents kept once (Of names a lower descriptor
// that keeps them).
func (p *Process) validGhostFD(f *FD, g *Ghost) bool {
	ok := f.Kind == FDFile && g.Mode <= 0o7777
	if g.Of != nil {
		var of *FD
		for i := range p.FDs {
			if p.FDs[i].FD == *g.Of {
				of = &p.FDs[i]
			}
		}
		ok = ok && len(g.Data) == 0 && *g.Of < f.FD && of != nil && of.Ghost != nil && of.Ghost.Of == nil
	}
	return ok
}

// validate checks one VMA alone.
func (v VMA) validate() error {
	switch {
	case v.Start%PageSize != 0 || v.End%PageSize != 0:
		return errors.New("not page-aligned")
	case v.End <= v.Start:
		return errors.New("empty or reversed")
	case v.Prot&^protMask != 0 || v.Prot < 0:
		return fmt.Errorf("prot %#x: bits other than PROT_READ, PROT_WRITE and PROT_EXEC", v.Prot)
	}
	switch v.Kind {
	case VMAAnon, VMAFile, VMAFileShared, VMAShmem, VMAVDSO, VMAVVar, VMAVVarVclock, VMAVsyscall:
	default:
		return fmt.Errorf("unknown kind %q", v.Kind)
	}
	if len(v.Inherited) > 0 && (v.Kind != VMAAnon || v.Flags&unix.MAP_SHARED != 0) {
		return errors.New("pages inherited from the parent in memory that is not private anonymous")
	}
	last := v.Start
	for _, r := range v.Inherited {
		if r.Start%PageSize != 0 || r.End%PageSize != 0 || r.Start < last || r.End <= r.Start || r.End > v.End {
			return fmt.Errorf("inherited pages %#x-%#x: not page-aligned, out of order or outside the VMA", r.Start, r.End)
		}
		last = r.End
	}
	return nil
}

// validate refuses a scheduling no kernel gives a thread (nil is none
// recorded), or an affinity mask beyond the 1024 CPUs restore can set.
func (s *Sched) validate() error {
	if s == nil {
		return nil
	}
	const resetOnFork = 0x40000000
	switch s.Policy &^ resetOnFork {
	case 0, 3, 5: // SCHED_OTHER, SCHED_BATCH, SCHED_IDLE
		if s.RTPriority != 0 {
			return fmt.Errorf("real-time priority %d under policy %d", s.RTPriority, s.Policy)
		}
	case 1, 2: // SCHED_FIFO, SCHED_RR
		if s.RTPriority < 1 || s.RTPriority > 99 {
			return fmt.Errorf("real-time priority %d, not within 1 to 99", s.RTPriority)
		}
	default:
		return fmt.Errorf("scheduling policy %#x", s.Policy)
	}
	if s.Nice < -20 || s.Nice > 19 {
		return fmt.Errorf("nice %d, not within -20 to 19", s.Nice)
	}
	if len(s.Affinity) > 16 {
		return fmt.Errorf("an affinity mask of %d words", len(s.Affinity))
	}
	if class := s.IOPrio >> 13; s.IOPrio < 0 || class > 3 {
		return fmt.Errorf("I/O priority %#x", s.IOPrio)
	}
	return nil
}
