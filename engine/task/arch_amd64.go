package task

import (
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// The snapshot's registers are x86-64's; these convert them to and from
// the kernel's struct user_regs_struct.

// toImageRegs also returns the system call the thread was in (orig_rax).
func toImageRegs(r *ptrace.Regs) (image.Regs, int64) {
	return image.Regs{R15: r.R15, R14: r.R14, R13: r.R13, R12: r.R12, Rbp: r.Rbp, Rbx: r.Rbx, R11: r.R11, R10: r.R10,
		R9: r.R9, R8: r.R8, Rax: r.Rax, Rcx: r.Rcx, Rdx: r.Rdx, Rsi: r.Rsi, Rdi: r.Rdi, OrigRax: r.Orig_rax, Rip: r.Rip,
		Cs: r.Cs, Eflags: r.Eflags, Rsp: r.Rsp, Ss: r.Ss, FsBase: r.Fs_base, GsBase: r.Gs_base, Ds: r.Ds, Es: r.Es, Fs: r.Fs, Gs: r.Gs}, int64(r.Orig_rax)
}

func fromImageRegs(r *image.Regs) ptrace.Regs {
	return ptrace.Regs{R15: r.R15, R14: r.R14, R13: r.R13, R12: r.R12, Rbp: r.Rbp, Rbx: r.Rbx, R11: r.R11, R10: r.R10,
		R9: r.R9, R8: r.R8, Rax: r.Rax, Rcx: r.Rcx, Rdx: r.Rdx, Rsi: r.Rsi, Rdi: r.Rdi, Orig_rax: r.OrigRax, Rip: r.Rip,
		Cs: r.Cs, Eflags: r.Eflags, Rsp: r.Rsp, Ss: r.Ss, Fs_base: r.FsBase, Gs_base: r.GsBase, Ds: r.Ds, Es: r.Es, Fs: r.Fs, Gs: r.Gs}
}
