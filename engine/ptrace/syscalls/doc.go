// Package syscalls is the library of typed system calls that dump and
// restore inject into a stopped thread, built on the injection mechanism
// of package ptrace.
//
// An [Injector] wraps a *ptrace.Injector ([New], [At], [Wrap]): the
// mechanism's methods (Call, Syscall, Batch, Close...) are promoted from
// it, and this package adds calls with typed arguments and results. They
// pass arguments through the Injector's scratch memory: [Injector.Put]
// writes bytes there and returns their address in the tracee,
// [Injector.Get] reads them back after the call; helpers such as
// [Injector.OpenAt2], [Injector.Fstat], [Injector.SetMM] and
// [Injector.Clone3] use the start of it.
//
// Each injected call is a resume of the thread and a wait for its stop. A
// dump asks many small questions, so [Injector.ReadProcess] and
// [Injector.ReadThread] read them in one batch (ptrace's Injector.Batch);
// a [Calls] collects calls and the data they point to for
// [Injector.RunCalls] to run in as few resumes as the scratch memory
// allows.
//
// The package is Linux and x86-64 only, like ptrace; [SigAction] is
// x86-64's struct kernel_sigaction.
package syscalls
