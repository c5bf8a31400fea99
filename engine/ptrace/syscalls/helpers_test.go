package syscalls

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/test/fixture"
)

// SA_* flags of x86-64.
const (
	saSigInfo  = 0x4
	saOnStack  = 0x08000000
	saRestart  = 0x10000000
	saRestorer = 0x04000000
)

func TestSigActionsAltStackPrctl(t *testing.T) {
	tr := newTracer(t)
	c := start(t, "handlers")
	ready := c.Ready
	p := seize(t, tr, c.PID, ptrace.SeizeOptions{})
	in, err := New(p.Leader(), pageSize)
	if err != nil {
		t.Fatal(err)
	}
	acts, err := sigActions(in)
	if err != nil {
		t.Fatal(err)
	}
	usr1 := acts[unix.SIGUSR1-1]
	if usr1.Handler != ready.MustUint(t, "h1") ||
		usr1.Flags&(saSigInfo|saRestart) != saSigInfo|saRestart ||
		usr1.Flags&saRestorer == 0 || usr1.Restorer == 0 ||
		usr1.Mask != 1<<(unix.SIGUSR2-1) {
		t.Errorf("SIGUSR1 action %+v (ready line %q)", usr1, ready)
	}
	term := acts[unix.SIGTERM-1]
	if term.Handler != ready.MustUint(t, "h2") || term.Flags&saOnStack == 0 || term.Mask != 0 {
		t.Errorf("SIGTERM action %+v", term)
	}
	if acts[unix.SIGPIPE-1].Handler != 1 {
		t.Errorf("SIGPIPE handler %#x, want SIG_IGN", acts[unix.SIGPIPE-1].Handler)
	}
	for sig := 1; sig <= NumSignals; sig++ {
		switch unix.Signal(sig) {
		case unix.SIGUSR1, unix.SIGTERM, unix.SIGPIPE:
			continue
		}
		if acts[sig-1].Handler != 0 {
			t.Errorf("signal %d handler %#x, want SIG_DFL", sig, acts[sig-1].Handler)
		}
	}

	alt, err := in.SigAltStack()
	if err != nil {
		t.Fatal(err)
	}
	if alt.Sp != ready.MustUint(t, "alt") || alt.Size != ready.MustUint(t, "altsize") || alt.Flags != 0 {
		t.Errorf("altstack %+v, want sp %#x size %d", alt, ready.MustUint(t, "alt"), ready.MustUint(t, "altsize"))
	}

	brk, err := in.Brk()
	if err != nil || brk == 0 {
		t.Errorf("brk %#x, %v", brk, err)
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", c.PID))
	if err != nil {
		t.Fatal(err)
	}
	if name, err := in.Name(); err != nil || name != strings.TrimSuffix(string(comm), "\n") || !strings.HasPrefix(name, "handlers") {
		t.Errorf("name %q, %v; want %q, the start of the binary's name", name, err, comm)
	}
	if v, err := in.Prctl(unix.PR_GET_DUMPABLE); err != nil || v != 1 {
		t.Errorf("PR_GET_DUMPABLE %d, %v", v, err)
	}
	if v, err := in.Prctl(unix.PR_GET_NO_NEW_PRIVS); err != nil || v != 0 {
		t.Errorf("PR_GET_NO_NEW_PRIVS %d, %v", v, err)
	}
	detachAlive(t, in, p, c)
}

// Per-thread state that only the thread itself (or an injected call) can
// read: tid address and rseq.
func TestPerThreadState(t *testing.T) {
	tr := newTracer(t)
	c := start(t, "tickthreads")
	// The fixture reported each thread before "ready"; collect them.
	want := map[int]fixture.Line{}
	p := seize(t, tr, c.PID, ptrace.SeizeOptions{})
	lines, err := c.Lines()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		if l.Event == "main" || l.Event == "thread" {
			want[int(l.MustInt(t, "tid"))] = l
		}
	}
	if len(want) != 5 {
		t.Fatalf("%d thread lines: %v", len(want), want)
	}
	lead, err := New(p.Leader(), pageSize)
	if err != nil {
		t.Fatal(err)
	}
	scratch, n := lead.Scratch()
	for _, th := range p.Threads() {
		line, ok := want[th.Tid()]
		if !ok {
			t.Fatalf("thread %d did not report", th.Tid())
		}
		in := lead
		if th.Tid() != p.Pid() {
			if in, err = At(th, lead.Stub(), scratch, n); err != nil {
				t.Fatal(err)
			}
		}
		ta, err := in.TidAddress()
		if err != nil {
			t.Fatal(err)
		}
		if ta != line.MustUint(t, "tidaddr") {
			t.Errorf("thread %d: tid address %#x, reported %q", th.Tid(), ta, line.Text)
		}
		rs, err := th.Rseq()
		if err != nil {
			t.Fatal(err)
		}
		if rs.Ptr != line.MustUint(t, "rseq") || rs.Signature != 0x53053053 || rs.Size < 32 {
			t.Errorf("thread %d: rseq %+v, reported %q", th.Tid(), rs, line.Text)
		}
		head, _, err := ptrace.RobustList(th.Tid())
		if err != nil || head == 0 {
			t.Errorf("thread %d: robust list %#x %v", th.Tid(), head, err)
		}
		if _, err := in.SigAltStack(); err != nil {
			t.Fatal(err)
		}
		if in != lead {
			if err := in.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := lead.Close(); err != nil {
		t.Fatal(err)
	}
	detachRuns(t, p, c)
}

const threadFlags = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
	unix.CLONE_THREAD | unix.CLONE_SYSVSEM

// Restore's path: a stub stopped at exec, a new process with a chosen pid
// made by clone3 in it, a thread with a chosen tid in that, injection into
// both.
func TestStartStoppedClone3(t *testing.T) {
	tr := newTracer(t)
	bin := fixture.Build(t, "sleeper")
	stub, err := tr.StartStopped(bin, []string{"stub"}, ptrace.StartOptions{Options: unix.PTRACE_O_EXITKILL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stub.Kill() })
	if st := taskStates(t, stub.Pid())[stub.Pid()]; st != 't' {
		t.Fatalf("stub state %c, want t", st)
	}
	// Stopped before its first instruction: at the dynamic loader's entry.
	sr, err := stub.Leader().Regs()
	if err != nil {
		t.Fatal(err)
	}
	if m := mappingOf(t, stub.Pid(), sr.Rip); !strings.Contains(m.Path, "ld-linux") {
		t.Fatalf("stub stopped at %#x in %q, want the loader", sr.Rip, m.Path)
	}
	in, err := New(stub.Leader(), pageSize)
	if err != nil {
		t.Fatal(err)
	}
	if got := mustCall(t, in, unix.SYS_GETPID); int(got) != stub.Pid() {
		t.Fatalf("getpid in stub = %d", got)
	}
	wantPid := freePid(t, stub.Pid())
	child, err := in.Clone3(CloneArgs{ExitSignal: uint64(unix.SIGCHLD), SetTID: []int{wantPid}})
	if err != nil {
		t.Fatal(err)
	}
	created := child.Process()
	t.Cleanup(func() { created.Kill() })
	if child.Tid() != wantPid || created.Pid() != wantPid || created == stub {
		t.Fatalf("child tid %d pid %d, want %d", child.Tid(), created.Pid(), wantPid)
	}
	if tr.Process(wantPid) != created {
		t.Fatal("Tracer.Process does not know the child")
	}
	if st := taskStates(t, wantPid)[wantPid]; st != 't' {
		t.Fatalf("child state %c, want t", st)
	}
	if cr, err := child.Regs(); err != nil || cr.Rip != in.Stub()+syscallLen || cr.Rax != 0 {
		t.Fatalf("child regs rip %#x rax %d (%v), want stub+2 and 0", cr.Rip, cr.Rax, err)
	}
	// Same addresses in the copy of the stub's memory.
	scratch, n := in.Scratch()
	cin, err := At(child, in.Stub(), scratch, n)
	if err != nil {
		t.Fatal(err)
	}
	if got := mustCall(t, cin, unix.SYS_GETPID); int(got) != wantPid {
		t.Fatalf("getpid in child = %d", got)
	}
	if got := mustCall(t, cin, unix.SYS_GETPPID); int(got) != stub.Pid() {
		t.Fatalf("getppid in child = %d", got)
	}
	// The pid is taken now: a second clone3 asking for it fails cleanly.
	if _, err := in.Clone3(CloneArgs{ExitSignal: uint64(unix.SIGCHLD), SetTID: []int{wantPid}}); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("clone3 with a taken pid: %v, want EEXIST", err)
	}

	// A thread with a chosen tid inside the new process.
	wantTid := freePid(t, wantPid)
	nt, err := cin.Clone3(CloneArgs{Flags: threadFlags, SetTID: []int{wantTid}})
	if err != nil {
		t.Fatal(err)
	}
	if nt.Tid() != wantTid || nt.Process() != created {
		t.Fatalf("thread %d in %d, want %d in %d", nt.Tid(), nt.Process().Pid(), wantTid, wantPid)
	}
	tin, err := At(nt, in.Stub(), scratch, n)
	if err != nil {
		t.Fatal(err)
	}
	if got := mustCall(t, tin, unix.SYS_GETTID); int(got) != wantTid {
		t.Fatalf("gettid in new thread = %d", got)
	}
	if got := mustCall(t, tin, unix.SYS_GETPID); int(got) != wantPid {
		t.Fatalf("getpid in new thread = %d", got)
	}
	if len(created.Threads()) != 2 {
		t.Fatalf("child has %d threads", len(created.Threads()))
	}
	// The thread leaves by an injected exit.
	if _, err := tin.Syscall(unix.SYS_EXIT, 0); !errors.Is(err, ptrace.ErrExited) {
		t.Fatalf("injected exit: %v, want ErrExited", err)
	}
	if len(created.Threads()) != 1 {
		t.Fatalf("child has %d threads after exit", len(created.Threads()))
	}
	if err := cin.Close(); err != nil {
		t.Fatal(err)
	}
	if err := created.Kill(); err != nil {
		t.Fatal(err)
	}
	// Dead; a zombie until its real parent, the stub, waits or dies.
	if st, err := proc.ReadStatus(wantPid); err == nil && st.State != 'Z' {
		t.Fatalf("child %d in state %c after Kill", wantPid, st.State)
	}
	// With CLONE_PARENT the new process is a child of ours, not of the
	// stub: killing the stub does not reparent it. clone3 wants
	// exit_signal 0 with CLONE_PARENT (the stub's SIGCHLD is used).
	sib, err := in.Clone3(CloneArgs{Flags: unix.CLONE_PARENT})
	if err != nil {
		t.Fatal(err)
	}
	sin, err := At(sib, in.Stub(), scratch, n)
	if err != nil {
		t.Fatal(err)
	}
	if got := mustCall(t, sin, unix.SYS_GETPPID); int(got) != os.Getpid() {
		t.Fatalf("getppid with CLONE_PARENT = %d, want %d", got, os.Getpid())
	}
	if err := sib.Process().Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", sib.Tid())); !os.IsNotExist(err) {
		t.Fatalf("CLONE_PARENT child not reaped by Kill: %v", err)
	}
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	if err := stub.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", stub.Pid())); !os.IsNotExist(err) {
		t.Fatalf("stub still there after Kill: %v", err)
	}
}

// Thread creation by injection in a seized, running program, which goes on
// working afterwards.
func TestClone3ThreadInSeized(t *testing.T) {
	_, c, p := startSeized(t, "sleeper", ptrace.SeizeOptions{})
	in, err := New(p.Leader(), 2*pageSize)
	if err != nil {
		t.Fatal(err)
	}
	nt, err := in.Clone3(CloneArgs{Flags: threadFlags})
	if err != nil {
		t.Fatal(err)
	}
	if nt.Process() != p || len(p.Threads()) != 2 {
		t.Fatalf("new thread %d not in the process", nt.Tid())
	}
	if ch := in.Children(); len(ch) != 1 || ch[0] != nt {
		t.Fatalf("children %v", ch)
	}
	scratch, n := in.Scratch()
	tin, err := At(nt, in.Stub(), scratch, n)
	if err != nil {
		t.Fatal(err)
	}
	if got := mustCall(t, tin, unix.SYS_GETTID); int(got) != nt.Tid() {
		t.Fatalf("gettid = %d want %d", got, nt.Tid())
	}
	if _, err := tin.Syscall(unix.SYS_EXIT, 0); !errors.Is(err, ptrace.ErrExited) {
		t.Fatalf("injected exit: %v", err)
	}
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	detachRuns(t, p, c)
	if n := len(taskStates(t, c.PID)); n != 1 {
		t.Fatalf("%d tasks after the injected thread exited", n)
	}
}

// mappingOf returns the mapping of pid that holds addr, failing the test if
// none does.
func mappingOf(t *testing.T, pid int, addr uint64) proc.Mapping {
	t.Helper()
	m, ok := findMapping(t, pid, addr)
	if !ok {
		t.Fatalf("%#x not mapped in %d", addr, pid)
	}
	return m
}

// findMapping returns the mapping of pid that holds addr, if any.
func findMapping(t *testing.T, pid int, addr uint64) (proc.Mapping, bool) {
	t.Helper()
	maps, err := proc.ReadMaps(pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range maps {
		if addr >= m.Start && addr < m.End {
			return m, true
		}
	}
	return proc.Mapping{}, false
}
