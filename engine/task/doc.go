// Package task dumps and restores the state of a process and its threads
// that is neither memory (engine/mem) nor descriptors (engine/fds): from
// /proc, its ids, credentials, limits, directories and mm fields
// (ReadProcess); by injected system calls, its signal actions, brk,
// prctl settings and each thread's registers, FP state, signal mask,
// rseq, robust list and alternate stack (Inject). At restore the same
// state goes back in: per process (RestoreProcess, credentials last, since
// they may drop the privileges the rest needs), per thread (RestoreThread)
// and, the last thing before the process runs, registers (SetThreadRegs).
//
// The restore's calls are added to a batch (the interface batch, which a
// *syscalls.Calls satisfies) apart from running it, so that the package's
// tests check which calls a state asks for, and in what order, through a
// fake.
package task
