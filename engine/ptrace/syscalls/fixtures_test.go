package syscalls

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

const (
	pageSize   = 4096
	syscallLen = 2 // length of the syscall instruction (x86-64)
)

// start starts fixture name (test/fixtures/<name>.c) for a test that
// traces it from this process: the harness leaves it unreaped until the
// test waits for it or cleanup kills it, so that no wait of the harness
// takes the ptrace stops from the tracer.
func start(t testing.TB, name string) *fixture.Proc {
	t.Helper()
	return fixture.StartWith(t, name, fixture.Options{Traced: true})
}

// newTracer returns a ptrace.Tracer closed in t.Cleanup, after checking ptrace is
// allowed.
func newTracer(t testing.TB) *ptrace.Tracer {
	t.Helper()
	testutil.RequirePtrace(t)
	tr, err := ptrace.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// startSeized starts fixture name (start) and seizes it with o, on a new
// ptrace.Tracer.
func startSeized(t testing.TB, name string, o ptrace.SeizeOptions) (*ptrace.Tracer, *fixture.Proc, *ptrace.Process) {
	t.Helper()
	tr := newTracer(t)
	c := start(t, name)
	return tr, c, seize(t, tr, c.PID, o)
}

// seize seizes pid, failing the test on error.
func seize(t testing.TB, tr *ptrace.Tracer, pid int, o ptrace.SeizeOptions) *ptrace.Process {
	t.Helper()
	p, err := tr.Seize(pid, o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// detachRuns detaches p and checks that the fixture c runs on: it ticks
// again.
func detachRuns(t testing.TB, p *ptrace.Process, c *fixture.Proc) {
	t.Helper()
	if err := p.Detach(); err != nil {
		t.Fatal(err)
	}
	c.Skip()
	c.Expect(t, "tick", 2*time.Second)
}

// taskStates returns tid -> state letter from /proc/PID/task/*/stat.
func taskStates(t testing.TB, pid int) map[int]byte {
	t.Helper()
	states, err := fixture.TaskStates(pid)
	if err != nil {
		t.Fatal(err)
	}
	return states
}

func mustCall(t *testing.T, in *Injector, nr int, args ...uint64) uint64 {
	t.Helper()
	r, err := in.Call(nr, args...)
	if err != nil {
		t.Fatalf("injected syscall %d: %v", nr, err)
	}
	return r
}

// sigActions reads the disposition of every signal with injected
// rt_sigaction(sig, NULL, &old, 8), one call each: a second way to read
// what ReadProcess reads in a batch. Element i is signal i+1.
func sigActions(in *Injector) ([NumSignals]SigAction, error) {
	var out [NumSignals]SigAction
	if err := in.NeedScratch(32); err != nil {
		return out, err
	}
	for sig := 1; sig <= NumSignals; sig++ {
		if _, err := in.Call(unix.SYS_RT_SIGACTION, uint64(sig), 0, in.scratch, 8); err != nil {
			return out, fmt.Errorf("rt_sigaction(%d): %w", sig, err)
		}
		if err := in.Get(0, bytesOf(&out[sig-1])); err != nil {
			return out, err
		}
	}
	return out, nil
}

// canBatch reports whether Batch runs its calls in one resume (the
// Injector was made by New, or by At on the stub of an open one);
// otherwise Batch injects them one by one.
func canBatch(t *testing.T, in *Injector) bool {
	t.Helper()
	calls := []ptrace.BatchCall{{Nr: unix.SYS_GETPID}, {Nr: unix.SYS_GETPID}}
	before := ptrace.Resumes()
	if err := in.Batch(0, calls); err != nil {
		t.Fatal(err)
	}
	return ptrace.Resumes()-before == 1
}

// bareStub is "syscall; int3" without the batch code after it.
var bareStub = []byte{0x0f, 0x05, 0xcc}

// freePid returns a pid that is not in use, well above the last one given.
func freePid(t testing.TB, after int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/ns_last_pid")
	if err != nil {
		t.Fatal(err)
	}
	last, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	maxb, _ := os.ReadFile("/proc/sys/kernel/pid_max")
	pidMax, _ := strconv.Atoi(strings.TrimSpace(string(maxb)))
	// Well past the last pid handed out, wrapping round below pid_max as
	// the kernel does (pids below 300 are reserved once it has wrapped).
	start := max(last, after) + 500
	for i := range pidMax {
		p := start + i
		if p >= pidMax {
			p = 300 + (p-pidMax)%(pidMax-300)
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", p)); os.IsNotExist(err) {
			return p
		}
	}
	t.Fatal("no free pid")
	return 0
}

// readUint64 reads one little-endian word of p.
func readUint64(p *ptrace.Process, addr uint64) (uint64, error) {
	var b [8]byte
	if err := p.ReadMem(addr, b[:]); err != nil {
		return 0, err
	}
	return le64(b[:]), nil
}

// detachAlive closes in, detaches p and checks that the fixture c runs on
// as it did: it answers SIGUSR1 (its first since start).
func detachAlive(t *testing.T, in *Injector, p *ptrace.Process, c *fixture.Proc) {
	t.Helper()
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Detach(); err != nil {
		t.Fatal(err)
	}
	c.Skip()
	if err := unix.Kill(c.PID, unix.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	c.Expect(t, "usr1=1", 2*time.Second)
}
