package ptrace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/test/fixture"
)

// Kernel restart codes seen in rax of a thread stopped inside a system
// call.
const (
	errRestartSys      = -512
	errRestartNoIntr   = -513
	errRestartNoHand   = -514
	errRestartRestartB = -516
)

func mustCall(t *testing.T, in *Injector, nr int, args ...uint64) uint64 {
	t.Helper()
	r, err := in.Call(nr, args...)
	if err != nil {
		t.Fatalf("injected syscall %d: %v", nr, err)
	}
	return r
}

// mapsContain reports whether addr is mapped in pid.
func mapsContain(t *testing.T, pid int, addr uint64) bool {
	t.Helper()
	_, ok := findMapping(t, pid, addr)
	return ok
}

func TestInjectBasics(t *testing.T) {
	_, c, p := startSeized(t, "spin", SeizeOptions{})
	th := p.Leader()
	before, err := th.Regs()
	if err != nil {
		t.Fatal(err)
	}
	vdsoBefore := vdsoBytes(t, p)

	in, err := th.NewInjector(2 * pageSize)
	if err != nil {
		t.Fatal(err)
	}
	scratch, n := in.Scratch()
	if n != 2*pageSize || !mapsContain(t, c.PID, in.Stub()) || !mapsContain(t, c.PID, scratch) {
		t.Fatalf("stub %#x scratch %#x+%d not mapped", in.Stub(), scratch, n)
	}
	if got := mustCall(t, in, unix.SYS_GETPID); int(got) != c.PID {
		t.Fatalf("getpid %d want %d", got, c.PID)
	}
	if got := mustCall(t, in, unix.SYS_GETTID); int(got) != c.PID {
		t.Fatalf("gettid %d want %d", got, c.PID)
	}
	// The text we patched to get going is as it was.
	if !bytes.Equal(vdsoBefore, vdsoBytes(t, p)) {
		t.Fatal("vdso text changed")
	}

	// mmap at a fixed address, write and read it from outside, then unmap.
	const fixed = 0x200000000000
	if got := mustCall(t, in, unix.SYS_MMAP, fixed, 3*pageSize, unix.PROT_READ,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED, ^uint64(0), 0); got != fixed {
		t.Fatalf("mmap fixed = %#x", got)
	}
	msg := []byte("written through /proc/PID/mem into a read-only page")
	if err := p.WriteMem(fixed+pageSize+100, msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if err := p.ReadMem(fixed+pageSize+100, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("read back %q, %v", got, err)
	}
	_, err = in.Call(unix.SYS_MMAP, fixed, pageSize, unix.PROT_READ,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED_NOREPLACE, ^uint64(0), 0)
	var se *SyscallError
	if !errors.Is(err, unix.EEXIST) || !errors.As(err, &se) || se.Nr != unix.SYS_MMAP {
		t.Fatalf("MAP_FIXED_NOREPLACE over a mapping: %v, want EEXIST", err)
	}
	if r, err := in.Syscall(unix.SYS_MMAP, fixed, pageSize, unix.PROT_READ,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED_NOREPLACE, ^uint64(0), 0); err != nil || Errno(r) != unix.EEXIST {
		t.Fatalf("raw result %d (%v)", r, err)
	}
	mustCall(t, in, unix.SYS_MUNMAP, fixed, 3*pageSize)
	if mapsContain(t, c.PID, fixed) {
		t.Fatal("munmap left the mapping")
	}
	if err := p.ReadMem(fixed, got); err == nil {
		t.Fatal("read of unmapped memory succeeded")
	}

	stub := in.Stub()
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	if mapsContain(t, c.PID, stub) {
		t.Fatal("injection area still mapped after Close")
	}
	after, err := th.Regs()
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("regs not restored:\n got %+v\nwant %+v", after, before)
	}
	detachRuns(t, p, c)
}

func vdsoBytes(t *testing.T, p *Process) []byte {
	t.Helper()
	maps, err := proc.ReadMaps(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range maps {
		if m.Path == "[vdso]" {
			b := make([]byte, m.Len())
			if err := p.ReadMem(m.Start, b); err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
	t.Fatal("no vdso")
	return nil
}

// A thread frozen in a blocking call shows the kernel's restart code;
// injected calls must not disturb it and the call must carry on.
func TestRestartNanosleep(t *testing.T) {
	tr := newTracer(t)
	c := start(t, "sleeper")
	c.Expect(t, "tick", 2*time.Second)
	time.Sleep(50 * time.Millisecond) // well inside the next 300 ms sleep
	p := seize(t, tr, c.PID, SeizeOptions{})
	th := p.Leader()
	r, err := th.Regs()
	if err != nil {
		t.Fatal(err)
	}
	if r.Orig_rax != unix.SYS_CLOCK_NANOSLEEP && r.Orig_rax != unix.SYS_NANOSLEEP {
		t.Fatalf("orig_rax %d, want (clock_)nanosleep", r.Orig_rax)
	}
	if int64(r.Rax) != errRestartRestartB {
		t.Fatalf("rax %d, want -ERESTART_RESTARTBLOCK", int64(r.Rax))
	}
	injectSome(t, th)
	if got, _ := th.Regs(); got != r {
		t.Fatalf("regs after injection differ")
	}
	if err := p.Detach(); err != nil {
		t.Fatal(err)
	}
	c.Skip()
	for range 3 {
		l := c.Expect(t, "tick", 2*time.Second)
		if !strings.HasSuffix(l.Text, "r=0") {
			t.Fatalf("nanosleep after resume: %q, want r=0 (no EINTR)", l.Text)
		}
	}
}

func TestRestartRead(t *testing.T) {
	tr := newTracer(t)
	c := startInRead(t)
	p := seize(t, tr, c.PID, SeizeOptions{})
	th := p.Leader()
	r, err := th.Regs()
	if err != nil {
		t.Fatal(err)
	}
	if r.Orig_rax != unix.SYS_READ || int64(r.Rax) != errRestartSys {
		t.Fatalf("orig_rax %d rax %d, want read and -ERESTARTSYS", r.Orig_rax, int64(r.Rax))
	}
	injectSome(t, th)
	if err := p.Detach(); err != nil {
		t.Fatal(err)
	}
	echoes(t, c, "hello")
}

// startInRead starts piper with a stdin pipe and waits until it is
// blocked reading it.
func startInRead(t *testing.T) *fixture.Proc {
	t.Helper()
	c := fixture.StartWith(t, "piper", fixture.Options{Stdin: true, Traced: true})
	waitSyscall(t, c.PID, unix.SYS_READ)
	return c
}

// echoes writes s to piper's stdin and checks that its read returns it:
// the next line is "got s".
func echoes(t *testing.T, c *fixture.Proc, s string) {
	t.Helper()
	if _, err := io.WriteString(c.Stdin, s); err != nil {
		t.Fatal(err)
	}
	if l := c.Expect(t, "", 2*time.Second); l.Text != "got "+s {
		t.Fatalf("after resume the fixture printed %q, want %q", l.Text, "got "+s)
	}
}

// waitSyscall waits until pid sits in system call nr.
func waitSyscall(t *testing.T, pid, nr int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", pid))
		if strings.HasPrefix(string(b), fmt.Sprintf("%d ", nr)) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("pid %d never blocked in syscall %d", pid, nr)
}

// injectSome runs a few calls through a fresh injector and closes it.
func injectSome(t *testing.T, th *Thread) {
	t.Helper()
	in, err := th.NewInjector(pageSize)
	if err != nil {
		t.Fatal(err)
	}
	mustCall(t, in, unix.SYS_GETPID)
	mustCall(t, in, unix.SYS_GETPPID)
	addr := mustCall(t, in, unix.SYS_MMAP, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, ^uint64(0), 0)
	mustCall(t, in, unix.SYS_MUNMAP, addr, pageSize)
	scratch, _ := in.Scratch()
	for sig := 1; sig <= 64; sig++ {
		mustCall(t, in, unix.SYS_RT_SIGACTION, uint64(sig), 0, scratch, 8)
	}
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
}

// An injected call that blocks is cut short; the thread is left as it was.
func TestInjectTimeout(t *testing.T) {
	tr := newTracer(t)
	c := startInRead(t)
	p := seize(t, tr, c.PID, SeizeOptions{})
	th := p.Leader()
	orig, _ := th.Regs()
	in, err := th.NewInjector(pageSize)
	if err != nil {
		t.Fatal(err)
	}
	in.SetTimeout(200 * time.Millisecond)
	scratch, _ := in.Scratch()
	t0 := time.Now()
	_, err = in.Syscall(unix.SYS_READ, 0, scratch, 16)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("blocking injected read: %v, want ErrTimeout", err)
	}
	if d := time.Since(t0); d > 3*time.Second {
		t.Fatalf("timeout took %v", d)
	}
	// Still usable.
	in.SetTimeout(0)
	if got := mustCall(t, in, unix.SYS_GETPID); int(got) != c.PID {
		t.Fatalf("getpid after timeout = %d", got)
	}
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	if got, _ := th.Regs(); got != orig {
		t.Fatal("regs not restored")
	}
	if err := p.Detach(); err != nil {
		t.Fatal(err)
	}
	echoes(t, c, "again")
}

// A signal that arrives while injected calls run is held and delivered on
// resume, to the handler, siginfo intact.
func TestSignalHeldDuringInjection(t *testing.T) {
	_, c, p := startSeized(t, "handlers", SeizeOptions{})
	th := p.Leader()
	if err := unix.Tgkill(c.PID, c.PID, unix.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	pend, err := th.PendingSignals(false)
	if err != nil {
		t.Fatal(err)
	}
	if len(pend) != 1 || pend[0].Signo() != unix.SIGUSR1 || pend[0].Pid() != int32(os.Getpid()) {
		t.Fatalf("pending %d signals (first %v)", len(pend), pend)
	}
	if sh, _ := th.PendingSignals(true); len(sh) != 0 {
		t.Fatalf("%d shared pending", len(sh))
	}
	in, err := th.NewInjector(pageSize)
	if err != nil {
		t.Fatal(err)
	}
	mustCall(t, in, unix.SYS_GETPID) // the signal stop comes and is held
	if pend, _ := th.PendingSignals(false); len(pend) != 0 {
		t.Fatalf("signal still queued: %d", len(pend))
	}
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	c.Skip()
	if err := p.Detach(); err != nil {
		t.Fatal(err)
	}
	c.Expect(t, "usr1=1", 2*time.Second)
}

func TestConcurrentUse(t *testing.T) {
	_, c, p := startSeized(t, "tickthreads", SeizeOptions{})
	ths := p.Threads()
	lead, err := ths[0].NewInjector(pageSize)
	if err != nil {
		t.Fatal(err)
	}
	scratch, n := lead.Scratch()
	var wg sync.WaitGroup
	errs := make(chan error, len(ths))
	for i, th := range ths {
		in := lead
		if i > 0 {
			if in, err = th.InjectorAt(lead.Stub(), scratch, n); err != nil {
				t.Fatal(err)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				tid, err := in.Call(unix.SYS_GETTID)
				if err != nil || int(tid) != th.Tid() {
					errs <- fmt.Errorf("gettid in %d = %d, %v", th.Tid(), tid, err)
					return
				}
				if _, err := th.Regs(); err != nil {
					errs <- err
					return
				}
				buf := make([]byte, 64)
				if err := p.ReadMem(scratch, buf); err != nil {
					errs <- err
					return
				}
			}
			if in != lead {
				errs <- in.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if err := lead.Close(); err != nil {
		t.Fatal(err)
	}
	detachRuns(t, p, c)
}

// Detach with an injector still open restores the thread first.
func TestDetachClosesInjector(t *testing.T) {
	_, c, p := startSeized(t, "sleeper", SeizeOptions{})
	in, err := p.Leader().NewInjector(pageSize)
	if err != nil {
		t.Fatal(err)
	}
	mustCall(t, in, unix.SYS_GETPID)
	stub := in.Stub()
	if err := p.Detach(); err != nil {
		t.Fatal(err)
	}
	if mapsContain(t, c.PID, stub) {
		t.Fatal("injection area left mapped")
	}
	c.Skip()
	c.Expect(t, "tick", 2*time.Second)
}
