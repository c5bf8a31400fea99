package syscalls

// SigAction is struct kernel_sigaction as rt_sigaction(2) sees it on
// x86-64.
type SigAction struct {
	Handler  uint64 // SIG_DFL 0, SIG_IGN 1, or the handler address
	Flags    uint64 // SA_*
	Restorer uint64
	Mask     uint64
}
