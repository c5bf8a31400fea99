package corefile

import (
	"debug/elf"
	"encoding/binary"
	"strings"

	"github.com/lazyfs/lazyfs/engine/image"
)

// The x86-64 layouts of the core's notes (arch/x86/include/asm/elf.h,
// include/linux/elfcore.h, include/uapi/linux/elfcore.h), written field
// by field, little-endian.

// coreMachine is e_machine of the core.
const coreMachine = elf.EM_X86_64

// fxsaveSize is the size of struct user_i387_struct (NT_FPREGSET): the
// legacy FXSAVE area, which also starts an XSAVE area.
const fxsaveSize = 512

// Sizes of struct elf_prstatus, struct elf_prpsinfo and siginfo_t.
const (
	prstatusSize = 336
	prpsinfoSize = 136
	siginfoSize  = 128
)

// userRegs returns the general registers in the order of struct
// user_regs_struct (elf_gregset_t).
func userRegs(r *image.Regs) [27]uint64 {
	return [27]uint64{r.R15, r.R14, r.R13, r.R12, r.Rbp, r.Rbx, r.R11, r.R10, r.R9, r.R8,
		r.Rax, r.Rcx, r.Rdx, r.Rsi, r.Rdi, r.OrigRax, r.Rip, r.Cs, r.Eflags, r.Rsp, r.Ss,
		r.FsBase, r.GsBase, r.Ds, r.Es, r.Fs, r.Gs}
}

// prstatus returns the struct elf_prstatus of thread t of process st;
// sig is the signal reported as current (0: none). The snapshot holds no
// CPU times: they are zero.
func prstatus(st *image.Process, t *image.Thread, sig int) []byte {
	b := make([]byte, prstatusSize)
	le := binary.LittleEndian
	le.PutUint32(b[0:], uint32(sig))   // pr_info.si_signo (si_code, si_errno 0)
	le.PutUint16(b[12:], uint16(sig))  // pr_cursig
	le.PutUint64(b[16:], t.SigPending) // pr_sigpend
	le.PutUint64(b[24:], t.SigMask)    // pr_sighold
	le.PutUint32(b[32:], uint32(t.TID))
	le.PutUint32(b[36:], uint32(st.PPID))
	le.PutUint32(b[40:], uint32(st.PGID))
	le.PutUint32(b[44:], uint32(st.SID))
	// pr_utime, pr_stime, pr_cutime, pr_cstime: 48..112
	for i, v := range userRegs(&t.Regs) {
		le.PutUint64(b[112+8*i:], v)
	}
	if fpregs(t) != nil {
		le.PutUint32(b[328:], 1) // pr_fpvalid
	}
	return b
}

// prpsinfo returns the struct elf_prpsinfo of st. The process was stopped
// for the dump: its state is 'T' (stopped), as the kernel numbers it.
func prpsinfo(st *image.Process) []byte {
	b := make([]byte, prpsinfoSize)
	le := binary.LittleEndian
	b[0] = 3   // pr_state
	b[1] = 'T' // pr_sname
	// pr_zomb, pr_nice 0; pr_flag (8) 0
	le.PutUint32(b[16:], st.Creds.UID[0])
	le.PutUint32(b[20:], st.Creds.GID[0])
	le.PutUint32(b[24:], uint32(st.PID))
	le.PutUint32(b[28:], uint32(st.PPID))
	le.PutUint32(b[32:], uint32(st.PGID))
	le.PutUint32(b[36:], uint32(st.SID))
	copy(b[40:40+15], st.Comm)                       // pr_fname[16], NUL-terminated
	copy(b[56:56+79], strings.Join(st.Cmdline, " ")) // pr_psargs[80]
	return b
}

// siginfo returns the siginfo_t of NT_SIGINFO for signal sig: only its
// number is known (si_code SI_USER, no sender).
func siginfo(sig int) []byte {
	b := make([]byte, siginfoSize)
	binary.LittleEndian.PutUint32(b[0:], uint32(sig))
	return b
}
