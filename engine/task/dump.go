package task

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
)

// MaxPIDNSDepth is how many pid namespaces below the dumper's a dumped
// process may live in: restore --pidns makes one.
const MaxPIDNSDepth = 1

// ReadProcess fills st with what /proc tells of process pid. A process
// in a pid namespace below ours has its pids there recorded (NSPID).
func ReadProcess(pid int, st *image.Process) error {
	s, err := proc.ReadStatus(pid)
	if err != nil {
		return err
	}
	stat, err := proc.ReadStat(pid)
	if err != nil {
		return err
	}
	if err := setIDs(pid, st, s, stat); err != nil {
		return err
	}
	if err := readNamespaces(pid, st); err != nil {
		return err
	}
	if err := readFiles(pid, st); err != nil {
		return err
	}
	if err := readLimits(pid, st); err != nil {
		return err
	}
	auxv, err := proc.ReadAuxv(pid)
	if err != nil {
		return err
	}
	st.MM = image.MM{StartCode: stat.StartCode, EndCode: stat.EndCode, StartData: stat.StartData, EndData: stat.EndData,
		StartBrk: stat.StartBrk, StartStack: stat.StartStack, ArgStart: stat.ArgStart, ArgEnd: stat.ArgEnd,
		EnvStart: stat.EnvStart, EnvEnd: stat.EnvEnd, Auxv: auxv}
	return nil
}

// setIDs fills st with the ids, credentials, umask and pending signals
// of process pid that its status and stat tell, refusing a process
// restore cannot rebuild: one under seccomp, or one more pid namespaces
// below ours than restore makes.
func setIDs(pid int, st *image.Process, s *proc.Status, stat *proc.Stat) error {
	st.PPID, st.PGID, st.SID = stat.PPid, stat.Pgrp, stat.Session
	st.Umask = s.Umask
	st.Creds = image.Creds{UID: s.Uid, GID: s.Gid, Groups: s.Groups, CapInh: s.CapInh, CapPrm: s.CapPrm, CapEff: s.CapEff,
		CapBnd: s.CapBnd, CapAmb: s.CapAmb, NoNewPrivs: s.NoNewPrivs, Seccomp: s.Seccomp}
	if s.Seccomp != 0 {
		return fmt.Errorf("%w: pid %d runs under seccomp (mode %d), which restore cannot rebuild", image.ErrUnsupported, pid, s.Seccomp)
	}
	switch {
	case len(s.NSpid) > MaxPIDNSDepth+1:
		return fmt.Errorf("%w: pid %d is %d pid namespaces below ours (pids %v); restore makes one", image.ErrUnsupported, pid, len(s.NSpid)-1, s.NSpid)
	case len(s.NSpid) > 1:
		st.NSPID = s.NSpid
	}
	st.SigPending = s.ShdPnd
	return nil
}

// readNamespaces refuses a process in a user namespace other than ours,
// and records the other namespaces process pid lives in and, if any
// (a container's), its cgroups.
func readNamespaces(pid int, st *image.Process) error {
	userNS, err := proc.Namespace(pid, "user")
	if err != nil {
		return err
	}
	mine, err := proc.Namespace(os.Getpid(), "user")
	if err != nil {
		return err
	}
	if userNS != mine {
		return fmt.Errorf("%w: pid %d lives in a user namespace of its own (%s; a rootless container's): its ids map to others than the host's, which a restore would not set", image.ErrUnsupported, pid, userNS)
	}
	if st.Namespaces, err = proc.OtherNamespaces(pid); err != nil {
		return err
	}
	if len(st.Namespaces) > 0 {
		// A container's: where it ran matters to a restore into another.
		if st.Cgroups, err = proc.Cgroups(pid); err != nil {
			return err
		}
	}
	return nil
}

// readFiles records the name, command line, program, working and root
// directories of process pid.
func readFiles(pid int, st *image.Process) error {
	var err error
	if st.Comm, err = proc.ReadComm(pid); err != nil {
		return err
	}
	st.Cmdline, _ = proc.ReadCmdline(pid)
	exe, err := proc.Exe(pid)
	if err != nil {
		return err
	}
	id, err := proc.ExeFile(pid)
	if err != nil {
		return err
	}
	st.Exe = fds.FileIdentity(exe, id)
	if st.Cwd, err = proc.Cwd(pid); err != nil {
		return err
	}
	if st.Root, err = proc.Root(pid); err != nil {
		return err
	}
	return nil
}

// readLimits records the personality, timer slack, OOM score adjustment
// and resource limits of process pid.
func readLimits(pid int, st *image.Process) error {
	pers, err := proc.Personality(pid)
	if err != nil {
		return err
	}
	st.Personality = uint64(pers)
	st.TimerSlackNs, _ = proc.TimerSlack(pid)
	if st.OOMScoreAdj, err = readOOMScoreAdj(pid); err != nil {
		return err
	}
	rl, err := proc.ReadRlimits(pid)
	if errors.Is(err, unix.EPERM) {
		// Another uid's process (an nginx worker) and no
		// CAP_SYS_RESOURCE: /proc tells the same numbers.
		rl, err = proc.ReadLimits(pid)
	}
	if err != nil {
		return err
	}
	for i, l := range rl {
		st.Rlimits = append(st.Rlimits, image.Rlimit{Resource: i, Cur: l.Cur, Max: l.Max})
	}
	return nil
}

// Inject fills st with the state that only the process itself can tell,
// by system calls injected into each thread of the frozen process p: one
// batch in the leader for the process and itself (ptrace.ReadProcess),
// one in each other thread. The stub and scratch memory the injection
// maps in the process are unmapped when it returns.
func Inject(p *ptrace.Process, st *image.Process, log *slog.Logger) error {
	threads := p.Threads()
	leader := p.Leader()
	in, err := syscalls.New(leader, 4*unix.Getpagesize())
	if err != nil {
		return fmt.Errorf("thread %d: prepare injection: %w", leader.Tid(), err)
	}
	defer func() {
		if cerr := in.Close(); cerr != nil {
			log.Error("end injection", "tid", leader.Tid(), "err", cerr)
		}
	}()
	info, err := in.ReadProcess()
	if err != nil {
		return fmt.Errorf("thread %d: %w", leader.Tid(), err)
	}
	for i, a := range info.SigActions {
		if a == (syscalls.SigAction{}) {
			continue
		}
		st.SigActions = append(st.SigActions, image.SigAction{Signal: i + 1, Handler: a.Handler, Flags: a.Flags, Restorer: a.Restorer, Mask: a.Mask})
	}
	st.MM.Brk = info.Brk
	st.Dumpable = info.Dumpable
	if info.SubreaperErr == nil {
		st.ChildSubreaper = info.ChildSubreaper
	}
	scratch, n := in.Scratch()
	for _, th := range threads {
		ti, tinfo := in, info.Thread
		if th != leader {
			ti, err = syscalls.At(th, in.Stub(), scratch, n)
			if err != nil {
				return fmt.Errorf("thread %d: %w", th.Tid(), err)
			}
			tinfo, err = ti.ReadThread()
		}
		var t image.Thread
		if err == nil {
			t, err = thread(st.PID, th, ti, tinfo)
		}
		if th != leader {
			if cerr := ti.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return fmt.Errorf("thread %d: %w", th.Tid(), err)
		}
		st.Threads = append(st.Threads, t)
	}
	return nil
}

// thread reads one thread's state. The Injector's saved registers are the
// thread's registers at the freeze.
func thread(pid int, th *ptrace.Thread, in *syscalls.Injector, info syscalls.ThreadInfo) (image.Thread, error) {
	t := image.Thread{TID: th.Tid()}
	regs := in.SavedRegs()
	t.Regs, t.Syscall = toImageRegs(&regs)
	fp, err := th.FPState()
	if err != nil {
		return t, err
	}
	if fp.Note == ptrace.NTX86XState {
		t.XState = fp.Data
	} else {
		t.FPRegs = fp.Data
	}
	if t.SigMask, err = th.SigMask(); err != nil {
		return t, err
	}
	if rs, err := th.Rseq(); err != nil {
		return t, err
	} else if rs.Ptr != 0 {
		t.Rseq = &image.Rseq{Addr: rs.Ptr, Len: rs.Size, Sig: rs.Signature, Flags: rs.Flags}
	}
	t.ClearChildTID = info.TidAddress
	t.PdeathSig = info.PdeathSig
	if t.RobustList, t.RobustListLen, err = ptrace.RobustList(th.Tid()); err != nil {
		return t, err
	}
	as := info.AltStack
	t.AltStack = image.AltStack{SP: as.Sp, Flags: as.Flags, Size: as.Size}
	if t.Comm, err = proc.ReadTaskComm(pid, th.Tid()); err != nil {
		return t, err
	}
	ts, err := proc.ReadTaskStatus(pid, th.Tid())
	if err != nil {
		return t, err
	}
	t.SigPending = ts.SigPnd
	if len(ts.NSpid) > 1 {
		t.NSTID = ts.NSpid
	}
	if t.Sched, err = readSched(pid, th.Tid()); err != nil {
		return t, err
	}
	return t, nil
}
