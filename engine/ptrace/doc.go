// Package ptrace is the tracer that dump and restore use to freeze a
// process, read and write the state of its threads, and run system calls
// inside it by injection.
//
// # Threads and the tracer goroutine
//
// The kernel binds a tracee to the thread that attached it: every ptrace
// request, and every wait for a tracee, must come from that one OS thread.
// A Tracer owns a goroutine locked to its OS thread and runs every request
// there ([Tracer.Do]); all typed methods of Process, Thread and Injector
// dispatch to it, so they are safe to call from any goroutine. Requests are
// serialised; wrap a burst of them in one Do to skip the hand-offs. While
// idle, the tracer thread passes signals on to processes it holds in the
// running state ([Process.Resume]) and reaps tracees killed from outside.
// When the Tracer's thread exits (Close), the kernel detaches whatever is
// still attached, killing tracees seized with PTRACE_O_EXITKILL. Remote
// memory access ([Process.ReadMem], [Process.WriteMem])
// does not need the tracer thread and runs on the caller's goroutine, so
// several goroutines can copy pages at once.
//
// # Freezing
//
// [Tracer.Seize] attaches with PTRACE_SEIZE to every thread listed in
// /proc/PID/task, interrupts each with PTRACE_INTERRUPT, waits for its stop
// and re-reads the task list until a pass finds no new thread. A signal that
// reaches a thread between the seize and its stop is delivered to it, as the
// kernel would have done without us (a handler frame is set up and the
// thread stops before the handler's first instruction; a fatal signal kills
// the process, reported as [ErrExited]); none is lost or reordered. A thread
// found in a group-stop (SIGSTOP) is left in it: it is still stopped after
// [Process.Detach]. A freeze that fails leaves the process running as it
// was: threads that did not stop in time (a cgroup-frozen process takes no
// interrupt until thawed) are detached by the tracer as soon as they stop.
//
// # Starting a process for restore
//
// [Tracer.StartStopped] forks and executes a program on the tracer thread
// and returns it stopped before its first instruction, seized like any
// other process; [Injector.CallNewTask] (clone3, typed as Clone3 in
// engine/ptrace/syscalls) then makes processes and threads with chosen ids
// inside it, auto-attached and stopped.
//
// # Injection
//
// An [Injector] runs system calls in one stopped thread: it points the
// thread's rip at a "syscall; int3" stub (0f 05 cc) in the target, sets rax
// and the argument registers, continues the thread and waits for the int3.
// orig_rax is set to -1 so that the kernel applies no syscall-restart logic
// to injected calls. [Injector.Close] writes the thread's original
// registers back; when the thread later resumes from that stop, the kernel
// applies the restart logic of the system call it was frozen in (rax =
// -ERESTARTSYS and friends, orig_rax = the call), so a thread frozen inside
// nanosleep or read carries on as if nothing had happened. Signals that
// arrive while injected calls run are held and delivered when the thread is
// resumed. Each call is a resume of the thread and a wait for its stop; an
// Injector made by [Thread.NewInjector] also maps a loop beside its stub
// that runs a table of calls in one resume ([Injector.Batch]), for a
// dump's many small questions.
//
// This package is the mechanism: injecting one system call, or a table of
// them. The typed calls built on it (passing arguments through scratch
// memory, opening and stat-ing files, PR_SET_MM, clone3, the batched reads
// of a dump) are in engine/ptrace/syscalls, whose Injector embeds this
// one. Below it, engine/ptrace/raw makes the ptrace requests and waits
// themselves, one function each, which only this package's tracer thread
// calls.
//
// # Errors
//
// A process or thread that is gone is reported as [ErrExited] (ESRCH, an
// exit or a kill seen by wait); seizing a pid that does not exist gives
// [ErrNoProcess]; a process that another tracer holds gives an
// [*AlreadyTracedError] matching [ErrAlreadyTraced]. Every wait has a
// deadline ([ErrTimeout]). An injected system call that fails returns its
// negative errno as the result; [Injector.Call] turns it into a
// [*SyscallError] that matches the errno with errors.Is.
//
// The package is Linux and x86-64 only; what is x86-64 about it (registers,
// the stub, the batch loop, the FPU register sets) is in arch_amd64.go.
//
// Its size (more than most packages here) is one responsibility: every
// ptrace request must come from the one thread that traces, so freezing,
// injection, register sets and the start of a stopped stub all run through
// the same Tracer loop and its per-thread state machine, which no other
// package may touch.
package ptrace
