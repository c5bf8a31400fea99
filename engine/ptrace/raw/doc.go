// Package raw makes the ptrace(2) requests and the waits that package
// ptrace is built from, one function each, typed but with no state: no
// thread bookkeeping, no retries, the kernel's errno returned as it is.
//
// The kernel binds a tracee to the thread that attached it, so every
// function here that takes a tid must be called from that one OS thread:
// ptrace's Tracer runs them all on its own locked goroutine. WaitOnce
// polls with waitid without blocking; its callers decide how long to wait.
//
// The package is Linux only; GetRegs and SetRegs, which take x86-64's
// register layout, are in regs_amd64.go.
package raw
