package ptrace

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestSeizeNoProcess(t *testing.T) {
	tr := newTracer(t)
	_, err := tr.Seize(1<<22+12345, SeizeOptions{})
	if !errors.Is(err, ErrNoProcess) {
		t.Fatalf("seize of a missing pid: %v, want ErrNoProcess", err)
	}
	if _, err := tr.Seize(0, SeizeOptions{}); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("seize 0: %v, want ErrNoProcess", err)
	}
}

func TestSeizeThreadIDRefused(t *testing.T) {
	tr := newTracer(t)
	c := start(t, "tickthreads")
	var other int
	for tid := range taskStates(t, c.PID) {
		if tid != c.PID {
			other = tid
		}
	}
	if _, err := tr.Seize(other, SeizeOptions{}); err == nil {
		t.Fatalf("seize of thread %d of %d succeeded", other, c.PID)
	}
}

func TestAlreadyTraced(t *testing.T) {
	tr, c, p := startSeized(t, "spin", SeizeOptions{})
	defer p.Detach()

	tr2 := newTracer(t)
	_, err := tr2.Seize(c.PID, SeizeOptions{})
	var ate *AlreadyTracedError
	if !errors.Is(err, ErrAlreadyTraced) || !errors.As(err, &ate) {
		t.Fatalf("second tracer: %v, want ErrAlreadyTraced", err)
	}
	// TracerPid in /proc is the tracing thread.
	if ate.TracerPid != tr.tid {
		t.Errorf("TracerPid %d, want the tracer thread %d", ate.TracerPid, tr.tid)
	}
	if _, err := tr.Seize(c.PID, SeizeOptions{}); !errors.Is(err, ErrAlreadyTraced) {
		t.Fatalf("same tracer twice: %v, want ErrAlreadyTraced", err)
	}
}

func TestFreezeSingleThreadRegsXState(t *testing.T) {
	_, c, p := startSeized(t, "spin", SeizeOptions{Options: unix.PTRACE_O_EXITKILL})
	requireFrozen(t, p)
	st := p.Stats()
	if st.Threads != 1 || st.Duration <= 0 {
		t.Errorf("stats %+v", st)
	}
	t.Logf("freeze of 1 thread: %v", st.Duration)
	th := p.Leader()
	r, err := th.Regs()
	if err != nil {
		t.Fatal(err)
	}
	if r.Cs != 0x33 || r.Rip == 0 || r.Rsp == 0 || r.Fs_base == 0 {
		t.Fatalf("implausible regs %+v", r)
	}
	// Round trip with a change, then back.
	r2 := r
	r2.R15 ^= 0x5a5a
	if err := th.SetRegs(&r2); err != nil {
		t.Fatal(err)
	}
	if got, _ := th.Regs(); got != r2 {
		t.Fatalf("regs after set: %+v want %+v", got, r2)
	}
	if err := th.SetRegs(&r); err != nil {
		t.Fatal(err)
	}

	fp, err := th.FPState()
	if err != nil {
		t.Fatal(err)
	}
	if fp.Note != NTX86XState || len(fp.Data) < 576 {
		t.Fatalf("FPState note %#x size %d", fp.Note, len(fp.Data))
	}
	t.Logf("xstate %d bytes", len(fp.Data))
	// Change xmm15's first byte (FXSAVE area offset 160+15*16), read back.
	mod := FPState{Note: fp.Note, Data: bytes.Clone(fp.Data)}
	mod.Data[160+15*16] ^= 0xff
	if err := th.SetFPState(mod); err != nil {
		t.Fatal(err)
	}
	back, err := th.FPState()
	if err != nil {
		t.Fatal(err)
	}
	if back.Data[160+15*16] != mod.Data[160+15*16] {
		t.Fatalf("xmm15 change not kept")
	}
	if err := th.SetFPState(fp); err != nil {
		t.Fatal(err)
	}
	fx, err := th.RegSet(NTPRFPReg)
	if err != nil || len(fx) != 512 {
		t.Fatalf("NT_PRFPREG: %d bytes, %v", len(fx), err)
	}
	if _, err := th.SigMask(); err != nil {
		t.Fatal(err)
	}
	detachRuns(t, p, c)
}

func TestFreezeThreads(t *testing.T) {
	_, c, p := startSeized(t, "tickthreads", SeizeOptions{Options: unix.PTRACE_O_TRACECLONE})
	requireFrozen(t, p)
	ths := p.Threads()
	if len(ths) != 5 || ths[0].Tid() != c.PID {
		t.Fatalf("threads %v", ths)
	}
	t.Logf("freeze of 5 threads: %+v", p.Stats())
	for _, th := range ths {
		if _, err := th.Regs(); err != nil {
			t.Fatal(err)
		}
	}
	// Frozen means frozen: the output stops.
	c.Skip()
	c.ExpectQuiet(t, 100*time.Millisecond)
	if err := p.Detach(); err != nil {
		t.Fatal(err)
	}
	c.Expect(t, "tick", 2*time.Second)
	requireNotTraced(t, c.PID, "after detach")
}

func TestFreezeChurn(t *testing.T) {
	tr := newTracer(t)
	c := start(t, "churn")
	for i := range 20 {
		opts := SeizeOptions{}
		if i%2 == 0 {
			opts.Options = unix.PTRACE_O_TRACECLONE
		}
		p, err := tr.Seize(c.PID, opts)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		requireFrozen(t, p)
		if i == 0 {
			t.Logf("churn freeze: %+v", p.Stats())
		}
		if err := p.Detach(); err != nil {
			t.Fatalf("round %d: detach: %v", i, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.Skip()
	c.Expect(t, "tick", 2*time.Second)
}

func TestGroupStopKept(t *testing.T) {
	tr := newTracer(t)
	c := start(t, "spin")
	if err := unix.Kill(c.PID, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState(t, c.PID, 'T')
	p := seize(t, tr, c.PID, SeizeOptions{})
	if st := p.Stats(); st.GroupStopped != 1 {
		t.Errorf("stats %+v, want 1 group-stopped", st)
	}
	if _, err := p.Leader().Regs(); err != nil {
		t.Fatal(err)
	}
	if err := p.Detach(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if st := taskStates(t, c.PID)[c.PID]; st != 'T' {
		t.Fatalf("state after detach %c, want T (still stopped)", st)
	}
	c.Skip()
	_ = unix.Kill(c.PID, unix.SIGCONT)
	c.Expect(t, "tick", 2*time.Second)
}

func waitState(t *testing.T, pid int, want byte) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if taskStates(t, pid)[pid] == want {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("pid %d never reached state %c", pid, want)
}

func TestKilledUnderneath(t *testing.T) {
	tr, c, p := startSeized(t, "spin", SeizeOptions{})
	th := p.Leader()
	in, err := th.NewInjector(4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(c.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, err = in.Syscall(unix.SYS_GETPID)
	if !errors.Is(err, ErrExited) {
		t.Fatalf("syscall in killed process: %v, want ErrExited", err)
	}
	if _, err := th.Regs(); !errors.Is(err, ErrExited) {
		t.Fatalf("regs of killed thread: %v, want ErrExited", err)
	}
	if err := p.Detach(); err != nil {
		t.Fatalf("detach after kill: %v", err)
	}
	// The tracer still works.
	c2 := start(t, "spin")
	p2 := seize(t, tr, c2.PID, SeizeOptions{})
	if err := p2.Kill(); err != nil {
		t.Fatal(err)
	}
	// Our process is the real parent: the exit is left for its wait.
	st, err := c2.WaitExit(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st == nil || st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("killed child's exit state %v, want killed by SIGKILL", st)
	}
}

func TestResumeFollowsSignals(t *testing.T) {
	_, c, p := startSeized(t, "handlers", SeizeOptions{Options: unix.PTRACE_O_TRACECLONE | unix.PTRACE_O_EXITKILL})
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	// Running under the tracer: a signal reaches the handler.
	c.Skip()
	if err := unix.Kill(c.PID, unix.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	c.Expect(t, "usr1=1", 2*time.Second)
	if err := p.Interrupt(0); err != nil {
		t.Fatal(err)
	}
	requireFrozen(t, p)
	if err := p.Detach(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(c.PID, unix.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	c.Expect(t, "usr1=2", 2*time.Second)
}

func TestRobustList(t *testing.T) {
	testutil := newTracer(t) // only for the ptrace capability check
	_ = testutil
	c := start(t, "tickthreads")
	// A thread registers its list when it starts, which may be after the
	// fixture says it is ready: wait a moment for every thread to have.
	for deadline := time.Now().Add(5 * time.Second); ; {
		var bad []string
		for tid := range taskStates(t, c.PID) {
			head, size, err := RobustList(tid)
			if err != nil {
				t.Fatal(err)
			}
			if head == 0 || size != 24 {
				bad = append(bad, fmt.Sprintf("thread %d: robust list %#x size %d", tid, head, size))
			}
		}
		if len(bad) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(strings.Join(bad, "; "))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, _, err := RobustList(1<<22 + 777); !errors.Is(err, ErrExited) {
		t.Errorf("missing tid: %v", err)
	}
}

var _ = fmt.Sprint
var _ = os.Getpid
