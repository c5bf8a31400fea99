package syscalls

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// ReadProcess and ReadThread, one batch each, read what the calls
// injected one by one read.
func TestBatchReadsAsSingleCalls(t *testing.T) {
	tr := newTracer(t)
	c := start(t, "handlers")
	p := seize(t, tr, c.PID, ptrace.SeizeOptions{})
	in, err := New(p.Leader(), 4*pageSize)
	if err != nil {
		t.Fatal(err)
	}
	if !canBatch(t, in) {
		t.Fatal("NewInjector's injector cannot batch")
	}
	info, err := in.ReadProcess()
	if err != nil {
		t.Fatal(err)
	}
	acts, err := sigActions(in)
	if err != nil {
		t.Fatal(err)
	}
	if info.SigActions != acts {
		t.Errorf("batched sigactions %+v\nwant %+v", info.SigActions, acts)
	}
	if info.SigActions[unix.SIGUSR1-1].Handler != c.Ready.MustUint(t, "h1") {
		t.Errorf("SIGUSR1 handler %#x, want %#x", info.SigActions[unix.SIGUSR1-1].Handler, c.Ready.MustUint(t, "h1"))
	}
	if brk, err := in.Brk(); err != nil || info.Brk != brk {
		t.Errorf("batched brk %#x, brk %#x %v", info.Brk, brk, err)
	}
	if info.Dumpable != 1 {
		t.Errorf("dumpable %d, want 1", info.Dumpable)
	}
	if info.SubreaperErr != nil || info.ChildSubreaper {
		t.Errorf("child subreaper %v, %v", info.ChildSubreaper, info.SubreaperErr)
	}
	alt, err := in.SigAltStack()
	if err != nil {
		t.Fatal(err)
	}
	if info.Thread.AltStack != alt || alt.Sp != c.Ready.MustUint(t, "alt") {
		t.Errorf("batched altstack %+v, want %+v (sp %#x)", info.Thread.AltStack, alt, c.Ready.MustUint(t, "alt"))
	}
	if ta, err := in.TidAddress(); err != nil || info.Thread.TidAddress != ta {
		t.Errorf("batched tid address %#x, want %#x %v", info.Thread.TidAddress, ta, err)
	}

	// A failing call does not stop the ones after it.
	calls := []ptrace.BatchCall{
		{Nr: unix.SYS_GETPID},
		{Nr: unix.SYS_CLOSE, Args: [6]uint64{^uint64(0)}},
		{Nr: unix.SYS_GETTID},
	}
	if err := in.Batch(1024, calls); err != nil {
		t.Fatal(err)
	}
	if calls[0].Result != int64(c.PID) || !errors.Is(ptrace.Errno(calls[1].Result), unix.EBADF) || calls[2].Result != int64(c.PID) {
		t.Errorf("batch results %d %d %d, want %d EBADF %d", calls[0].Result, calls[1].Result, calls[2].Result, c.PID, c.PID)
	}
	if err := in.Batch(1, calls); err == nil {
		t.Error("batch table at an unaligned offset accepted")
	}
	detachAlive(t, in, p, c)
}

// Every thread's batch, through the leader's stub, reads its own state.
func TestBatchPerThread(t *testing.T) {
	tr := newTracer(t)
	c := start(t, "tickthreads")
	p := seize(t, tr, c.PID, ptrace.SeizeOptions{})
	lead, err := New(p.Leader(), pageSize)
	if err != nil {
		t.Fatal(err)
	}
	scratch, n := lead.Scratch()
	seen := map[uint64]bool{}
	for _, th := range p.Threads() {
		in := lead
		if th.Tid() != p.Pid() {
			if in, err = At(th, lead.Stub(), scratch, n); err != nil {
				t.Fatal(err)
			}
			if !canBatch(t, in) {
				t.Errorf("thread %d: injector on the leader's stub cannot batch", th.Tid())
			}
		}
		info, err := in.ReadThread()
		if err != nil {
			t.Fatal(err)
		}
		ta, err := in.TidAddress()
		if err != nil {
			t.Fatal(err)
		}
		if info.TidAddress != ta || ta == 0 || seen[ta] {
			t.Errorf("thread %d: batched tid address %#x, single %#x (seen before: %v)", th.Tid(), info.TidAddress, ta, seen[ta])
		}
		seen[ta] = true
		if in != lead {
			if err := in.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// An injector on a stub without the batch code after it (one the
	// caller wrote itself) runs a batch call by call.
	addr := mustCall(t, lead, unix.SYS_MMAP, 0, pageSize, unix.PROT_READ|unix.PROT_EXEC, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, ^uint64(0), 0)
	if err := p.WriteMem(addr, bareStub); err != nil {
		t.Fatal(err)
	}
	other := p.Threads()[0]
	if other.Tid() == p.Pid() {
		other = p.Threads()[1]
	}
	in, err := At(other, addr, scratch, n)
	if err != nil {
		t.Fatal(err)
	}
	if canBatch(t, in) {
		t.Error("injector on a stub of its own claims the batch code")
	}
	info, err := in.ReadThread()
	if err != nil {
		t.Fatal(err)
	}
	if ta, err := in.TidAddress(); err != nil || info.TidAddress != ta {
		t.Errorf("thread %d: call-by-call tid address %#x, single %#x %v", other.Tid(), info.TidAddress, ta, err)
	}
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	// One WriteStub wrote has the batch code after it: InjectorAt finds
	// it there, and the batch runs in one resume.
	if err := p.WriteStub(addr); err != nil {
		t.Fatal(err)
	}
	if in, err = At(other, addr, scratch, n); err != nil {
		t.Fatal(err)
	}
	if !canBatch(t, in) {
		t.Error("injector on a stub WriteStub wrote does not find its batch code")
	}
	before := ptrace.Resumes()
	info, err = in.ReadThread()
	if err != nil {
		t.Fatal(err)
	}
	if got := ptrace.Resumes() - before; got != 1 {
		t.Errorf("a batch on WriteStub's stub took %d resumes, want 1", got)
	}
	if ta, err := in.TidAddress(); err != nil || info.TidAddress != ta {
		t.Errorf("thread %d: batched tid address %#x, single %#x %v", other.Tid(), info.TidAddress, ta, err)
	}
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	mustCall(t, lead, unix.SYS_MUNMAP, addr, pageSize)
	if err := lead.Close(); err != nil {
		t.Fatal(err)
	}
	detachRuns(t, p, c)
}
