package task

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
)

// sigaltstack flags (not in x/sys/unix).
const (
	ssOnStack = 1
	ssDisable = 2
)

// batch is what the restore of a process's state adds its system calls
// to, to run in one resume of a thread: a *syscalls.Calls (the tests'
// records them).
type batch interface {
	// Add appends system call nr with args; what names it in an error.
	Add(what string, nr int, args ...uint64)
	// Data puts b in the batch's scratch data and returns the address
	// it will have in the thread.
	Data(b []byte) uint64
	// String puts s, NUL-terminated, in the scratch data and returns
	// its address.
	String(s string) uint64
}

// restorer is one RestoreProcess.
type restorer struct {
	in  *syscalls.Injector
	st  *image.Process
	log *slog.Logger
}

// RestoreProcess restores, through in (the leader's injector), the
// per-process state: signal actions, umask, working and root directories,
// personality, prctl settings, resource limits; then, in every thread
// (threads, in the order of st.Threads, injected through area), the
// credentials (last, since they may drop the privileges the rest needs)
// with no_new_privs, which the kernel keeps per thread: a thread created
// before has snapctl's. Its session and process group were set as the
// process was created.
func RestoreProcess(in *syscalls.Injector, threads []*ptrace.Thread, area uint64, scratch int, st *image.Process, log *slog.Logger) error {
	r := &restorer{in: in, st: st, log: log}
	// Signal actions, umask, directories, personality and prctl settings
	// go in one batch: one resume of the process rather than seventy.
	c := in.NewCalls()
	r.processCalls(c)
	if err := in.RunCalls(c); err != nil {
		return err
	}
	for _, l := range st.Rlimits {
		lim := unix.Rlimit{Cur: l.Cur, Max: l.Max}
		if err := unix.Prlimit(r.in.Thread().Process().Pid(), l.Resource, &lim, nil); err != nil {
			r.log.Warn("resource limit not restored", "resource", l.Resource, "cur", l.Cur, "max", l.Max, "err", err)
		}
	}
	for i := range st.Threads {
		tr := r
		if i > 0 {
			tin, err := syscalls.At(threads[i], area, area+image.PageSize, scratch)
			if err != nil {
				return fmt.Errorf("thread %d: %w", st.Threads[i].TID, err)
			}
			tr = &restorer{in: tin, st: st, log: log}
			err = tr.threadCreds(&st.Threads[i])
			if cerr := tin.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("thread %d: %w", st.Threads[i].TID, err)
			}
			continue
		}
		if err := tr.threadCreds(&st.Threads[0]); err != nil {
			return err
		}
	}
	return nil
}

// processCalls adds to c the per-process calls of RestoreProcess: signal
// actions, umask, directories, personality and prctl settings.
func (r *restorer) processCalls(c batch) {
	st := r.st
	r.sigActions(c)
	c.Add("umask", unix.SYS_UMASK, uint64(st.Umask))
	if st.Root != "" && st.Root != "/" {
		c.Add("chroot "+st.Root, unix.SYS_CHROOT, c.String(st.Root))
	}
	c.Add("chdir "+st.Cwd, unix.SYS_CHDIR, c.String(st.Cwd))
	c.Add(fmt.Sprintf("personality %#x", st.Personality), unix.SYS_PERSONALITY, st.Personality)
	c.Add(fmt.Sprintf("prctl(PR_SET_DUMPABLE, %d)", st.Dumpable), unix.SYS_PRCTL, unix.PR_SET_DUMPABLE, uint64(st.Dumpable))
	if st.ChildSubreaper {
		c.Add("prctl(PR_SET_CHILD_SUBREAPER)", unix.SYS_PRCTL, unix.PR_SET_CHILD_SUBREAPER, 1)
	}
	if st.TimerSlackNs != 0 {
		c.Add("prctl(PR_SET_TIMERSLACK)", unix.SYS_PRCTL, unix.PR_SET_TIMERSLACK, st.TimerSlackNs)
	}
}

// threadCreds sets the credentials of thread t (the one r injects into),
// its parent-death signal and no_new_privs, in one batch of calls: one
// resume of the thread. Every call of a batch runs; if one fails, the
// restore fails and the process is killed before it runs.
func (r *restorer) threadCreds(t *image.Thread) error {
	c := r.in.NewCalls()
	r.threadCredCalls(c, t)
	return r.in.RunCalls(c)
}

// threadCredCalls adds to c the calls of threadCreds.
func (r *restorer) threadCredCalls(c batch, t *image.Thread) {
	r.creds(c)
	if t.PdeathSig != 0 {
		// After the credentials: changing them clears it.
		c.Add(fmt.Sprintf("prctl(PR_SET_PDEATHSIG, %d)", t.PdeathSig), unix.SYS_PRCTL, unix.PR_SET_PDEATHSIG, uint64(t.PdeathSig))
	}
	if r.st.Creds.NoNewPrivs {
		c.Add("prctl(PR_SET_NO_NEW_PRIVS)", unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
	}
}

// sigActions adds to c the action of every signal: the dumped ones, and
// the default for the rest (the stub may have inherited ignored signals).
func (r *restorer) sigActions(c batch) {
	acts := map[int][4]uint64{}
	for _, a := range r.st.SigActions {
		acts[a.Signal] = [4]uint64{a.Handler, a.Flags, a.Restorer, a.Mask}
	}
	buf := make([]byte, 32)
	for sig := 1; sig <= syscalls.NumSignals; sig++ {
		if sig == int(unix.SIGKILL) || sig == int(unix.SIGSTOP) {
			continue
		}
		for i, w := range acts[sig] {
			binary.LittleEndian.PutUint64(buf[8*i:], w)
		}
		c.Add("rt_sigaction("+strconv.Itoa(sig)+")", unix.SYS_RT_SIGACTION, uint64(sig), c.Data(buf), 0, 8)
	}
}

// creds adds to c what sets the capabilities, groups, gids and uids (as
// CRIU: the bounding set is dropped to the dumped one while the process
// is still privileged, its permitted capabilities kept across the change
// of uid (PR_SET_KEEPCAPS), then set, and the ambient ones raised).
func (r *restorer) creds(c batch) {
	r.dropBounding(c)
	c.Add("prctl(PR_SET_KEEPCAPS)", unix.SYS_PRCTL, unix.PR_SET_KEEPCAPS, 1)
	r.ids(c)
	r.capabilities(c, r.st.Creds)
}

// dropBounding adds to c the drop from the bounding set of the
// capabilities the process did not have in it.
func (r *restorer) dropBounding(c batch) {
	last := lastCap()
	for cp := 0; cp <= last; cp++ {
		if r.st.Creds.CapBnd&(1<<cp) != 0 {
			continue
		}
		c.Add(fmt.Sprintf("prctl(PR_CAPBSET_DROP, %d)", cp), unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uint64(cp))
	}
}

// lastCap is the highest capability this kernel knows.
func lastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if n, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil && n >= 0 && n < 64 {
		return n
	}
	return 40 // CAP_CHECKPOINT_RESTORE, the last of Linux 6.x
}

// capabilities adds to c what sets the effective, permitted and
// inheritable sets (capset), raises the ambient ones, and ends keeping
// the permitted ones across uid changes, as a process does by default.
func (r *restorer) capabilities(c batch, cr image.Creds) {
	// struct __user_cap_header_struct (version 3, this thread), then two
	// struct __user_cap_data_struct: the low and high 32 bits.
	var b [8 + 24]byte
	le := binary.LittleEndian
	le.PutUint32(b[0:], unix.LINUX_CAPABILITY_VERSION_3)
	for i, half := range []int{0, 32} {
		d := b[8+12*i:]
		le.PutUint32(d[0:], uint32(cr.CapEff>>half))
		le.PutUint32(d[4:], uint32(cr.CapPrm>>half))
		le.PutUint32(d[8:], uint32(cr.CapInh>>half))
	}
	at := c.Data(b[:])
	c.Add(fmt.Sprintf("capset(effective %#x, permitted %#x, inheritable %#x)", cr.CapEff, cr.CapPrm, cr.CapInh), unix.SYS_CAPSET, at, at+8)
	for cp := 0; cp < 64; cp++ {
		if cr.CapAmb&(1<<cp) == 0 {
			continue
		}
		c.Add(fmt.Sprintf("prctl(PR_CAP_AMBIENT_RAISE, %d)", cp), unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, uint64(cp))
	}
	c.Add("prctl(PR_SET_KEEPCAPS, 0)", unix.SYS_PRCTL, unix.PR_SET_KEEPCAPS, 0)
}

// ids adds to c what sets groups, gids and uids where they differ from
// snapctl's.
func (r *restorer) ids(c batch) {
	cr := r.st.Creds
	if cr.UID == [4]uint32{} && cr.GID == [4]uint32{} && len(cr.Groups) <= 1 && unix.Geteuid() == 0 {
		return
	}
	buf := make([]byte, 4*len(cr.Groups))
	for i, g := range cr.Groups {
		binary.LittleEndian.PutUint32(buf[4*i:], g)
	}
	at := uint64(0)
	if len(buf) > 0 {
		at = c.Data(buf)
	}
	c.Add("setgroups", unix.SYS_SETGROUPS, uint64(len(cr.Groups)), at)
	c.Add("setresgid", unix.SYS_SETRESGID, uint64(cr.GID[0]), uint64(cr.GID[1]), uint64(cr.GID[2]))
	c.Add("setfsgid", unix.SYS_SETFSGID, uint64(cr.GID[3]))
	c.Add("setresuid", unix.SYS_SETRESUID, uint64(cr.UID[0]), uint64(cr.UID[1]), uint64(cr.UID[2]))
	c.Add("setfsuid", unix.SYS_SETFSUID, uint64(cr.UID[3]))
}

// RestoreThread restores, through in (injecting into the thread), what
// the thread t registers with the kernel: its name, clear_child_tid,
// robust list, alternate signal stack and rseq.
func RestoreThread(in *syscalls.Injector, t *image.Thread) error {
	// One batch: one resume of the thread.
	c := in.NewCalls()
	threadCalls(c, t)
	return in.RunCalls(c)
}

// threadCalls adds to c the calls of RestoreThread.
func threadCalls(c batch, t *image.Thread) {
	name := t.Comm
	if len(name) > 15 {
		name = name[:15]
	}
	c.Add("prctl(PR_SET_NAME)", unix.SYS_PRCTL, unix.PR_SET_NAME, c.String(name))
	c.Add("set_tid_address", unix.SYS_SET_TID_ADDRESS, t.ClearChildTID)
	if t.RobustList != 0 {
		c.Add("set_robust_list", unix.SYS_SET_ROBUST_LIST, t.RobustList, t.RobustListLen)
	}
	if t.AltStack.Flags&ssDisable == 0 && t.AltStack.Size != 0 {
		ss := make([]byte, 24) // stack_t: sp, flags (int + pad), size
		binary.LittleEndian.PutUint64(ss[0:], t.AltStack.SP)
		binary.LittleEndian.PutUint32(ss[8:], uint32(t.AltStack.Flags&^ssOnStack))
		binary.LittleEndian.PutUint64(ss[16:], t.AltStack.Size)
		c.Add("sigaltstack", unix.SYS_SIGALTSTACK, c.Data(ss), 0)
	}
	if t.Rseq != nil {
		c.Add(fmt.Sprintf("rseq register at %#x", t.Rseq.Addr), unix.SYS_RSEQ, t.Rseq.Addr, uint64(t.Rseq.Len), 0, uint64(t.Rseq.Sig))
	}
}

// SetThreadRegs sets the thread's registers, FP state and signal mask:
// the last thing before the process runs. A thread that was inside a
// system call (orig_rax >= 0, rax = -ERESTART*) has it restarted by the
// kernel when it resumes from this stop; -ERESTART_RESTARTBLOCK becomes
// -EINTR, since the restart block stayed with the dumped process.
func SetThreadRegs(th *ptrace.Thread, t *image.Thread) error {
	regs := fromImageRegs(&t.Regs)
	if err := th.SetRegs(&regs); err != nil {
		return fmt.Errorf("thread %d: set registers: %w", t.TID, err)
	}
	fp := ptrace.FPState{Note: ptrace.NTX86XState, Data: t.XState}
	if len(t.XState) == 0 {
		fp = ptrace.FPState{Note: ptrace.NTPRFPReg, Data: t.FPRegs}
	}
	if err := th.SetFPState(fp); err != nil {
		return fmt.Errorf("thread %d: set FP state (%d bytes; this CPU may differ from the dump's): %w", t.TID, len(fp.Data), err)
	}
	if err := th.SetSigMask(t.SigMask); err != nil {
		return fmt.Errorf("thread %d: set signal mask: %w", t.TID, err)
	}
	return nil
}

// SetMM sets the mm fields, auxv and exe of the process in injects into
// with PR_SET_MM_MAP. The old exe (the stub's) must be unmapped already,
// as the kernel requires. A program deleted while it ran is the file made
// again for its mappings, among ghosts (mem.Target.Ghosts).
func SetMM(in *syscalls.Injector, st *image.Process, ghosts map[[2]uint64]int, foreign bool, log *slog.Logger) error {
	if strings.HasSuffix(st.Exe.Path, deletedSuffix) {
		fd, ok := ghosts[[2]uint64{st.Exe.Dev, st.Exe.Ino}]
		if !ok {
			return fmt.Errorf("%w: the program %s was deleted, and no mapping of it kept it", image.ErrUnsupported, st.Exe.Path)
		}
		return in.SetMM(syscalls.MM(st.MM), fd)
	}
	exeFD, err := fds.OpenVerified(in, st.Exe.Path, unix.O_RDONLY|unix.O_CLOEXEC, st.Exe, fds.Match{Bytes: true, Foreign: foreign})
	if err != nil {
		return err
	}
	defer func() {
		if err := in.CloseFD(exeFD); err != nil {
			log.Warn("close in restored process", "fd", exeFD, "err", err)
		}
	}()
	return in.SetMM(syscalls.MM(st.MM), exeFD)
}

// deletedSuffix ends the link of a file that was deleted.
const deletedSuffix = " (deleted)"
