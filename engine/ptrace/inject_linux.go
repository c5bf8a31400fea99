package ptrace

import (
	"bytes"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace/raw"
)

const pageSize = 4096

// Injector runs system calls inside one stopped thread. It is created by
// Thread.NewInjector (which maps its own stub and scratch memory) or
// Thread.InjectorAt (which uses a stub the caller provides). A thread has
// at most one open Injector; Close restores the registers the thread had
// when the Injector was created (or those given to SetRegs).
type Injector struct {
	th *Thread

	// Set at creation, read-only afterwards.
	stub       uint64 // address of "syscall; int3"
	batch      uint64 // address of batchCode, or 0 if there is none
	scratch    uint64
	scratchLen int

	// Owned by the tracer goroutine.
	mapped    uint64 // start of memory we mapped (stub page + scratch); 0 if none
	mappedLen int
	saved     Regs // written back by Close
	timeout   time.Duration
	children  []*Thread // tasks auto-attached by the last call
	closed    bool
}

// NewInjector prepares injection into th: it writes "syscall; int3" over
// the start of an executable mapping ([vdso] if there is one, else the
// first r-x mapping), injects an mmap of one stub page (r-x) followed by
// scratchLen bytes of read-write scratch memory, puts the stub there (and
// the batch code after it) and writes the original text back. Close
// unmaps both. The thread must be stopped. Other threads of the process
// must not run meanwhile.
func (th *Thread) NewInjector(scratchLen int) (*Injector, error) {
	var in *Injector
	err := th.p.t.Do(func() error {
		var err error
		in, err = th.newInjector(scratchLen)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("set up injection in thread %d: %w", th.tid, err)
	}
	return in, nil
}

// InjectorAt prepares injection into th through a "syscall; int3" stub
// that already exists at stub (for instance one the caller mapped, or
// another Injector's Stub()), with scratch memory at scratch. Close does
// not unmap them.
func (th *Thread) InjectorAt(stub, scratch uint64, scratchLen int) (*Injector, error) {
	var in *Injector
	err := th.p.t.Do(func() error {
		var err error
		in, err = th.begin(stub, scratch, scratchLen)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("injection in thread %d: %w", th.tid, err)
	}
	return in, nil
}

// begin opens an injection session on th.
func (th *Thread) begin(stub, scratch uint64, scratchLen int) (*Injector, error) {
	if err := th.stopped(); err != nil {
		return nil, err
	}
	if th.inj != nil {
		return nil, fmt.Errorf("thread %d already has an open injector", th.tid)
	}
	in := &Injector{th: th, stub: stub, scratch: scratch, scratchLen: scratchLen, timeout: DefaultTimeout}
	for _, o := range th.p.threads {
		// Another thread's injector mapped this stub, and the batch code
		// after it.
		if o.inj != nil && o.inj.mapped != 0 && o.inj.stub == stub {
			in.batch = o.inj.batch
		}
	}
	if in.batch == 0 && stub != 0 {
		// A stub WriteStub wrote has the batch code after it.
		code := make([]byte, StubLen)
		if err := th.p.ReadMem(stub, code); err == nil && bytes.Equal(code, stubWithBatch()) {
			in.batch = stub + batchOff
		}
	}
	if err := raw.GetRegs(th.tid, &in.saved); err != nil {
		return nil, th.check("PTRACE_GETREGS", err)
	}
	if err := checkABI(&in.saved); err != nil {
		return nil, fmt.Errorf("thread %d %w", th.tid, err)
	}
	th.inj = in
	return in, nil
}

func (th *Thread) newInjector(scratchLen int) (*Injector, error) {
	if scratchLen < 0 {
		return nil, fmt.Errorf("negative scratch length")
	}
	scratchLen = (scratchLen + pageSize - 1) &^ (pageSize - 1)
	total := pageSize + scratchLen
	maps, err := proc.ReadMaps(th.p.pid)
	if err != nil {
		return nil, fmt.Errorf("read maps: %w", err)
	}
	sites := patchSites(maps)
	if len(sites) == 0 {
		return nil, fmt.Errorf("no executable mapping to place a syscall in")
	}
	in, err := th.begin(0, 0, 0)
	if err != nil {
		return nil, err
	}
	var addr int64
	for _, site := range sites {
		addr, err = in.viaPatch(site, unix.SYS_MMAP, 0, uint64(total), unix.PROT_READ|unix.PROT_EXEC,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, ^uint64(0), 0)
		if err == nil || errors.Is(err, ErrExited) {
			break
		}
	}
	if err == nil {
		err = Errno(addr)
	}
	if err != nil {
		in.abort()
		return nil, fmt.Errorf("inject mmap: %w", err)
	}
	base := uint64(addr)
	in.mapped, in.mappedLen = base, total
	if err := th.p.writeMem(base, stubWithBatch()); err != nil {
		in.abort()
		return nil, fmt.Errorf("write stub: %w", err)
	}
	in.stub, in.batch = base, base+batchOff
	if scratchLen > 0 {
		if _, err := in.call(unix.SYS_MPROTECT, base+pageSize, uint64(scratchLen), unix.PROT_READ|unix.PROT_WRITE); err != nil {
			in.abort()
			return nil, fmt.Errorf("make scratch writable: %w", err)
		}
		in.scratch, in.scratchLen = base+pageSize, scratchLen
	}
	return in, nil
}

// patchSites lists where the stub may be written temporarily: [vdso]
// first (its pages are never dumped, so the copy-on-write the write causes
// changes nothing a dump sees), then every other r-x mapping.
func patchSites(maps []proc.Mapping) []uint64 {
	rx := func(m proc.Mapping) bool {
		return m.Perms&(proc.PermRead|proc.PermWrite|proc.PermExec) == proc.PermRead|proc.PermExec
	}
	var out []uint64
	for _, m := range maps {
		if m.Path == "[vdso]" && rx(m) {
			out = append(out, m.Start)
		}
	}
	for _, m := range maps {
		if rx(m) && m.Path != "[vdso]" && m.Path != "[vsyscall]" {
			out = append(out, m.Start)
		}
	}
	return out
}

// viaPatch runs one syscall through "syscall; int3" written over the text
// at site, and always writes the text back.
func (in *Injector) viaPatch(site uint64, nr int, args ...uint64) (int64, error) {
	tid := in.th.tid
	orig, err := raw.Peek(tid, site)
	if err != nil {
		return 0, in.th.check("PTRACE_PEEKTEXT", err)
	}
	if err := raw.Poke(tid, site, patchWord(orig)); err != nil {
		return 0, in.th.check("PTRACE_POKETEXT", err)
	}
	r, err := in.syscallAt(site, nr, args)
	if perr := raw.Poke(tid, site, orig); perr != nil && err == nil {
		err = in.th.check("PTRACE_POKETEXT (restore)", perr)
	}
	return r, err
}

// abort ends a session that failed: scratch unmapped if we got that far,
// registers restored.
func (in *Injector) abort() { _ = in.close() }

// Stub returns the address of the "syscall; int3" stub.
func (in *Injector) Stub() uint64 { return in.stub }

// Scratch returns the scratch memory: address and length. The typed calls
// of engine/ptrace/syscalls and Batch use it and overwrite its start.
func (in *Injector) Scratch() (addr uint64, n int) { return in.scratch, in.scratchLen }

// Thread returns the thread the Injector runs in.
func (in *Injector) Thread() *Thread { return in.th }

// SetTimeout bounds how long one injected call may take (DefaultTimeout
// if d <= 0).
func (in *Injector) SetTimeout(d time.Duration) {
	_ = in.th.p.t.Do(func() error {
		if d <= 0 {
			d = DefaultTimeout
		}
		in.timeout = d
		return nil
	})
}

// Syscall runs system call nr with up to six arguments in the thread and
// returns the raw result: a negative errno ([-4095, -1]) when the call
// failed (decode it with Errno). The error is for the injection itself:
// [ErrExited] if the thread is gone (an injected exit), [ErrTimeout],
// a [*StopError] on a fault. The thread's registers are as at the start of
// the session again whenever the thread is still there and the call
// failed to complete.
func (in *Injector) Syscall(nr int, args ...uint64) (int64, error) {
	if len(args) > 6 {
		return 0, fmt.Errorf("syscall %d: %d arguments, at most 6", nr, len(args))
	}
	var r int64
	err := in.th.p.t.Do(func() error {
		var err error
		r, err = in.syscall(nr, args)
		return err
	})
	return r, err
}

// Call is Syscall with the errno turned into a *SyscallError.
func (in *Injector) Call(nr int, args ...uint64) (uint64, error) {
	r, err := in.Syscall(nr, args...)
	if err != nil {
		return 0, err
	}
	if e := Errno(r); e != nil {
		return 0, &SyscallError{Nr: nr, Errno: e.(unix.Errno)}
	}
	return uint64(r), nil
}

// call is Call on the tracer thread.
func (in *Injector) call(nr int, args ...uint64) (uint64, error) {
	r, err := in.syscall(nr, args)
	if err != nil {
		return 0, err
	}
	if e := Errno(r); e != nil {
		return 0, &SyscallError{Nr: nr, Errno: e.(unix.Errno)}
	}
	return uint64(r), nil
}

func (in *Injector) syscall(nr int, args []uint64) (int64, error) {
	if in.closed {
		return 0, fmt.Errorf("injector of thread %d is closed", in.th.tid)
	}
	return in.syscallAt(in.stub, nr, args)
}

// Children returns the tasks that the last injected call created and that
// were auto-attached (PTRACE_O_TRACECLONE/TRACEFORK): threads of this
// process, or new processes (see Thread.Process).
func (in *Injector) Children() []*Thread {
	var out []*Thread
	_ = in.th.p.t.Do(func() error { out = append(out, in.children...); return nil })
	return out
}

// syscallAt runs one system call through the "syscall; int3" at stub.
func (in *Injector) syscallAt(stub uint64, nr int, args []uint64) (int64, error) {
	regs := in.saved
	setSyscall(&regs, stub, nr, args)
	r, err := in.run(&regs, stub+stubTrapAt, stub+syscallLen)
	if err != nil {
		return 0, fmt.Errorf("syscall %d: %w", nr, err)
	}
	return syscallResult(&r), nil
}

// resumes counts the injected runs of this process (Resumes).
var resumes atomic.Int64

// Resumes returns how many times an injector of this process resumed a
// thread to run injected code (a call, or a batch of them) and waited
// for it to stop: what a step of a restore spends its time on.
func Resumes() int64 { return resumes.Load() }

// run resumes the thread with regs until it reaches the int3 before trap
// (or faults on unmapped, the instruction after a call that unmapped the
// stub; 0: none) and returns its registers there.
func (in *Injector) run(regs *Regs, trap, unmapped uint64) (Regs, error) {
	th := in.th
	resumes.Add(1)
	if err := th.stopped(); err != nil {
		return Regs{}, err
	}
	in.children = in.children[:0]
	if err := raw.SetRegs(th.tid, regs); err != nil {
		return Regs{}, th.check("PTRACE_SETREGS", err)
	}
	if err := raw.Cont(th.tid, 0); err != nil {
		err = th.check("PTRACE_CONT", err)
		in.restoreRegs()
		return Regs{}, err
	}
	th.state = stRunning
	deadline := time.Now().Add(in.timeout)
	for {
		st, err := th.p.t.waitStop(th.tid, th.reap(), deadline)
		if err != nil {
			if errors.Is(err, ErrTimeout) {
				in.stopRunaway()
			}
			return Regs{}, err
		}
		th.apply(st)
		if th.state == stExited {
			return Regs{}, fmt.Errorf("thread %d %v: %w", th.tid, st, ErrExited)
		}
		done, r, err := in.classify(trap, unmapped, st)
		if err != nil {
			in.restoreRegs()
			return Regs{}, err
		}
		if done {
			return r, nil
		}
		if err := raw.Cont(th.tid, 0); err != nil {
			return Regs{}, th.check("PTRACE_CONT", err)
		}
		th.state = stRunning
	}
}

// classify looks at one stop during an injected call. done means the call
// finished (the int3 before trap reached, or a fault at unmapped after a
// call that unmapped the stub), with the registers there. Otherwise the
// stop was dealt with and the thread should be continued.
func (in *Injector) classify(trap, unmapped uint64, st raw.Status) (done bool, regs Regs, err error) {
	th := in.th
	if th.state == stSignal {
		si, err := raw.GetSigInfo(th.tid)
		if err != nil {
			return false, regs, th.check("PTRACE_GETSIGINFO", err)
		}
		kernel := si.Code() > 0 // synchronous, raised by the CPU or kernel
		if kernel && (st.Sig == unix.SIGTRAP || st.Sig == unix.SIGSEGV) {
			var r Regs
			if err := raw.GetRegs(th.tid, &r); err != nil {
				return false, regs, th.check("PTRACE_GETREGS", err)
			}
			switch {
			case st.Sig == unix.SIGTRAP && pc(&r) == trap:
				return true, r, nil
			case st.Sig == unix.SIGSEGV && unmapped != 0 && pc(&r) == unmapped && si.Addr() == unmapped:
				// The call unmapped the stub itself (the final munmap).
				return true, r, nil
			}
			return false, regs, &StopError{Tid: th.tid, Signal: st.Sig, Addr: si.Addr(), Rip: pc(&r)}
		}
		if kernel && isFault(st.Sig) {
			var r Regs
			_ = raw.GetRegs(th.tid, &r)
			return false, regs, &StopError{Tid: th.tid, Signal: st.Sig, Addr: si.Addr(), Rip: pc(&r)}
		}
		// An asynchronous signal: hold it until the thread resumes.
		th.held = append(th.held, si)
		return false, regs, nil
	}
	switch st.Event {
	case unix.PTRACE_EVENT_CLONE, unix.PTRACE_EVENT_FORK, unix.PTRACE_EVENT_VFORK:
		msg, err := raw.EventMsg(th.tid)
		if err != nil {
			return false, regs, th.check("PTRACE_GETEVENTMSG", err)
		}
		in.children = append(in.children, th.p.t.adopt(th.p, int(msg)))
	case unix.PTRACE_EVENT_EXEC:
		return false, regs, fmt.Errorf("thread %d: exec during an injected call is not supported", th.tid)
	}
	// Interrupts, group-stop notifications, exit events: carry on.
	return false, regs, nil
}

func isFault(s unix.Signal) bool {
	return s == unix.SIGSEGV || s == unix.SIGBUS || s == unix.SIGILL || s == unix.SIGFPE || s == unix.SIGTRAP
}

// stopRunaway stops a thread whose injected call did not come back in
// time (a call that blocks), and restores its registers.
func (in *Injector) stopRunaway() {
	th := in.th
	_ = raw.Interrupt(th.tid)
	deadline := time.Now().Add(time.Second)
	for th.state == stRunning {
		st, err := th.p.t.waitStop(th.tid, th.reap(), deadline)
		if err != nil {
			return
		}
		th.apply(st)
		if th.state == stSignal {
			if si, err := raw.GetSigInfo(th.tid); err == nil {
				th.held = append(th.held, si)
			}
			if raw.Cont(th.tid, 0) == nil {
				th.state = stRunning
			}
		}
	}
	in.restoreRegs()
}

// restoreRegs writes the session's saved registers back.
func (in *Injector) restoreRegs() error {
	if in.th.state == stExited || in.th.state == stRunning {
		return nil
	}
	return in.th.check("PTRACE_SETREGS", raw.SetRegs(in.th.tid, &in.saved))
}

// SetRegs sets the registers Close writes back (by default, those the
// thread had when the Injector was created).
func (in *Injector) SetRegs(r *Regs) {
	_ = in.th.p.t.Do(func() error { in.saved = *r; return nil })
}

// SavedRegs returns the registers Close will write back.
func (in *Injector) SavedRegs() Regs {
	var r Regs
	_ = in.th.p.t.Do(func() error { r = in.saved; return nil })
	return r
}

// Close ends the session: memory that NewInjector mapped is unmapped and
// the saved registers are written back. The thread stays stopped. When the
// thread resumes, the kernel applies the restart logic of the system call
// it was frozen in.
func (in *Injector) Close() error { return in.th.p.t.Do(in.close) }

func (in *Injector) close() error {
	if in.closed {
		return nil
	}
	th := in.th
	var errs []error
	if in.mapped != 0 && in.stub != 0 && th.state != stExited {
		if _, err := in.call(unix.SYS_MUNMAP, in.mapped, uint64(in.mappedLen)); err != nil {
			errs = append(errs, fmt.Errorf("unmap injection area: %w", err))
		}
	}
	if err := in.restoreRegs(); err != nil && !errors.Is(err, ErrExited) {
		errs = append(errs, err)
	}
	in.closed = true
	if th.inj == in {
		th.inj = nil
	}
	return errors.Join(errs...)
}
