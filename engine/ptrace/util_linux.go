package ptrace

import "golang.org/x/sys/unix"

// yield gives the CPU away while a wait spins.
func yield() { _, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
