package ptrace

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
)

// Signals racing with the freeze are never lost: each one sent just
// before a Seize is handled exactly once, whether it was delivered before
// the seize, let through by the freeze, or left pending across it.
func TestNoSignalLostAcrossFreeze(t *testing.T) {
	tr := newTracer(t)
	c := start(t, "handlers")
	const rounds = 30
	caught := 0
	for i := 1; i <= rounds; i++ {
		if err := unix.Kill(c.PID, unix.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		p, err := tr.Seize(c.PID, SeizeOptions{})
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		caught += p.Stats().SignalsDelivered
		if err := p.Detach(); err != nil {
			t.Fatal(err)
		}
		c.Expect(t, fmt.Sprintf("usr1=%d", i), 2*time.Second)
	}
	t.Logf("%d of %d signals arrived during the freeze and were let through", caught, rounds)
}

// PTRACE_GETSIGMASK of a thread inside ppoll/pselect/sigsuspend reports
// the thread's own mask (the kernel's saved_sigmask), not the call's
// temporary one, before and after injected calls.
func TestSigMaskOfPpoll(t *testing.T) {
	tr := newTracer(t)
	c := start(t, "ppoll")
	waitSyscall(t, c.PID, unix.SYS_PPOLL)
	p := seize(t, tr, c.PID, SeizeOptions{})
	th := p.Leader()
	r, _ := th.Regs()
	if r.Orig_rax != unix.SYS_PPOLL || int64(r.Rax) != errRestartNoHand {
		t.Fatalf("orig_rax %d rax %d, want ppoll and -ERESTARTNOHAND", r.Orig_rax, int64(r.Rax))
	}
	before, err := th.SigMask()
	if err != nil {
		t.Fatal(err)
	}
	in, err := th.NewInjector(0)
	if err != nil {
		t.Fatal(err)
	}
	after, err := th.SigMask()
	if err != nil {
		t.Fatal(err)
	}
	if before != 0 || after != 0 {
		t.Fatalf("mask in ppoll %#x, after an injected call %#x; want the thread's own mask 0 both times", before, after)
	}
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Detach(); err != nil {
		t.Fatal(err)
	}
	c.Skip()
	for range 3 {
		if l := c.Expect(t, "tick", 2*time.Second); !strings.HasSuffix(l.Text, "r=0") {
			t.Fatalf("ppoll after resume: %q", l.Text)
		}
	}
}

// A thread already in a signal-delivery-stop when the freeze comes gets
// its signal: the freeze stops it at the handler's first instruction and
// the handler runs after the detach.
func TestFreezeLetsSignalThrough(t *testing.T) {
	tr := newTracer(t)
	c := start(t, "handlers")
	ready := c.Ready
	p := seize(t, tr, c.PID, SeizeOptions{})
	if err := unix.Tgkill(c.PID, c.PID, unix.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	// Resume and freeze again in one request, so that the tracer cannot
	// pass the signal on in between: the thread sits in its
	// signal-delivery-stop when the freeze starts.
	err := tr.Do(func() error {
		for _, th := range p.threadList() {
			if err := th.release(false); err != nil {
				return err
			}
		}
		time.Sleep(50 * time.Millisecond)
		return tr.freeze(p, time.Now().Add(5*time.Second))
	})
	if err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.SignalsDelivered != 1 {
		t.Fatalf("stats %+v, want 1 signal delivered", st)
	}
	r, err := p.Leader().Regs()
	if err != nil {
		t.Fatal(err)
	}
	if r.Rip != ready.MustUint(t, "h1") || r.Rdi != uint64(unix.SIGUSR1) {
		t.Fatalf("stopped at rip %#x rdi %d, want the SIGUSR1 handler %#x entered with signo", r.Rip, r.Rdi, ready.MustUint(t, "h1"))
	}
	c.Skip()
	if err := p.Detach(); err != nil {
		t.Fatal(err)
	}
	c.Expect(t, "usr1=1", 2*time.Second)
}

func TestCloseDetaches(t *testing.T) {
	tr := newTracer(t)
	c := start(t, "tickthreads")
	if _, err := tr.Seize(c.PID, SeizeOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Seize(c.PID, SeizeOptions{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("seize after close: %v", err)
	}
	c.Skip()
	c.Expect(t, "tick", 2*time.Second)
	requireNotTraced(t, c.PID, "after Close")
}

func TestRemoteMemory(t *testing.T) {
	_, _, p := startSeized(t, "sleeper", SeizeOptions{})
	in, err := p.Leader().NewInjector(0)
	if err != nil {
		t.Fatal(err)
	}
	const size = 9 << 20
	addr := mustCall(t, in, unix.SYS_MMAP, 0, size+pageSize, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, ^uint64(0), 0)
	mustCall(t, in, unix.SYS_MUNMAP, addr+size, pageSize) // a hole after it
	data := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	if err := p.WriteMem(addr, data); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if err := p.ReadMem(addr, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	// Across the end of the mapping: a short read and an error.
	n, err := p.ReadAt(got[:2*pageSize], int64(addr+size-pageSize))
	if err == nil || n != pageSize {
		t.Fatalf("read across the hole: n=%d err=%v, want %d and an error", n, err, pageSize)
	}
	if err := p.WriteMem(addr+size, []byte{1}); err == nil {
		t.Fatal("write into the hole succeeded")
	}
	mustCall(t, in, unix.SYS_MUNMAP, addr, size)
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Detach(); err != nil {
		t.Fatal(err)
	}
}

func BenchmarkInjectGetpid(b *testing.B) {
	_, _, p := startSeized(b, "sleeper", SeizeOptions{})
	in, err := p.Leader().NewInjector(0)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close()
	for b.Loop() {
		if _, err := in.Call(unix.SYS_GETPID); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadMem(b *testing.B) {
	_, _, p := startSeized(b, "sleeper", SeizeOptions{})
	in, err := p.Leader().NewInjector(0)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close()
	const size = 64 << 20
	addr, err := in.Call(unix.SYS_MMAP, 0, size, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE, ^uint64(0), 0)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 4<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	for off := uint64(0); off < size; off += uint64(len(buf)) {
		if err := p.WriteMem(addr+off, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(size)
	for b.Loop() {
		for off := uint64(0); off < size; off += uint64(len(buf)) {
			if err := p.ReadMem(addr+off, buf); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func BenchmarkFreezeThreads(b *testing.B) {
	tr, _, p := startSeized(b, "tickthreads", SeizeOptions{})
	pid := p.Pid()
	if err := p.Detach(); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		q := seize(b, tr, pid, SeizeOptions{})
		if err := q.Detach(); err != nil {
			b.Fatal(err)
		}
	}
}

// Many calls in one Tracer.Do save the hand-off to the tracer thread.
func BenchmarkInjectGetpidInDo(b *testing.B) {
	tr, _, p := startSeized(b, "sleeper", SeizeOptions{})
	in, err := p.Leader().NewInjector(0)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close()
	err = tr.Do(func() error {
		for b.Loop() {
			if _, err := in.Call(unix.SYS_GETPID); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// A freeze that times out (here: a cgroup-frozen process, which takes no
// interrupt stop until thawed) leaves the process as it was: the threads
// that did not stop are detached as soon as they do.
func TestFreezeTimeoutLeavesProcess(t *testing.T) {
	tr := newTracer(t)
	const root = "/sys/fs/cgroup/freezer"
	if _, err := os.Stat(root + "/freezer.state"); err != nil {
		if _, err := os.Stat(root + "/tasks"); err != nil {
			t.Skipf("no cgroup v1 freezer at %s", root)
		}
	}
	c := start(t, "spin")
	cg := fmt.Sprintf("%s/lazyfs-ptrace-%d", root, c.PID)
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = os.WriteFile(cg+"/freezer.state", []byte("THAWED"), 0)
		_ = os.WriteFile(root+"/tasks", []byte(strconv.Itoa(c.PID)), 0)
		_ = os.Remove(cg)
	})
	if err := os.WriteFile(cg+"/tasks", []byte(strconv.Itoa(c.PID)), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cg+"/freezer.state", []byte("FROZEN"), 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		b, _ := os.ReadFile(cg + "/freezer.state")
		if strings.TrimSpace(string(b)) == "FROZEN" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cgroup not frozen: %s", b)
		}
		time.Sleep(5 * time.Millisecond)
	}
	_, err := tr.Seize(c.PID, SeizeOptions{Timeout: 200 * time.Millisecond})
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("seize of a frozen process: %v, want ErrTimeout", err)
	}
	if err := os.WriteFile(cg+"/freezer.state", []byte("THAWED"), 0); err != nil {
		t.Fatal(err)
	}
	c.Skip()
	c.Expect(t, "tick", 2*time.Second)
	deadline = time.Now().Add(2 * time.Second)
	for {
		st, err := proc.ReadStatus(c.PID)
		if err != nil {
			t.Fatal(err)
		}
		if st.TracerPid == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still traced by %d after thaw", st.TracerPid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// And the tracer can have it now.
	p := seize(t, tr, c.PID, SeizeOptions{})
	requireFrozen(t, p)
	if err := p.Detach(); err != nil {
		t.Fatal(err)
	}
}
