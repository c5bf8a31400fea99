package uffd

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// target is a running uffdops fixture (test/fixtures/uffdops.c): a process
// that creates a userfaultfd for the test to take, as restore takes one
// created in the target by an injected system call, and then works on its
// memory on command. Commands and numbers are hex; each answer is one line,
// "ok ..." or "err ...".
type target struct {
	t   testing.TB
	p   *fixture.Proc
	ufd int // the userfaultfd's number in the process
}

// startTarget starts uffdops, after skipping or failing the test where the
// machine cannot run it. Its process group, with the children that "fork"
// makes, is killed at cleanup.
func startTarget(t testing.TB) *target {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireUserfaultfd(t)
	p := fixture.StartWith(t, "uffdops", fixture.Options{Stdin: true})
	return &target{t: t, p: p, ufd: int(p.Ready.MustInt(t, "uffd"))}
}

// startMapped starts uffdops, takes its userfaultfd (takeUffd) and maps
// size bytes in it, at base.
func startMapped(t testing.TB, size uint64) (f *target, fd int, base uint64) {
	t.Helper()
	f = startTarget(t)
	fd = f.takeUffd()
	base = f.do("map %x", size)[0]
	return f, fd, base
}

// startRegistered is startMapped with the mapping registered for missing
// faults.
func startRegistered(t testing.TB, size uint64) (f *target, fd int, base uint64) {
	t.Helper()
	f, fd, base = startMapped(t, size)
	if _, err := uffdio.Register(fd, base, size, uffdio.RegisterModeMissing); err != nil {
		t.Fatal(err)
	}
	return f, fd, base
}

// send writes a command without waiting for its answer.
func (f *target) send(format string, args ...any) {
	f.t.Helper()
	if _, err := fmt.Fprintf(f.p.Stdin, format+"\n", args...); err != nil {
		f.t.Fatalf("uffdops command: %v", err)
	}
}

// do runs a command and returns the fields of its "ok" answer as numbers.
func (f *target) do(format string, args ...any) []uint64 {
	f.t.Helper()
	f.send(format, args...)
	return f.answer(format, 20*time.Second)
}

// answer waits for the answer to the oldest command not yet answered and
// returns its fields as numbers; anything but "ok" fails the test.
func (f *target) answer(what string, timeout time.Duration) []uint64 {
	f.t.Helper()
	l := f.p.Expect(f.t, "", timeout)
	if l.Event != "ok" {
		f.t.Fatalf("uffdops %q: %q", what, l.Text)
	}
	var v []uint64
	for _, s := range l.Args {
		n, err := strconv.ParseUint(s, 16, 64)
		if err != nil {
			f.t.Fatalf("uffdops %q: %q", what, l.Text)
		}
		v = append(v, n)
	}
	return v
}

// takeUffd takes the fixture's userfaultfd (pidfd_getfd, as restore does),
// enables Features, and has the fixture close its own copy.
func (f *target) takeUffd() int {
	f.t.Helper()
	pfd, err := unix.PidfdOpen(f.p.PID, 0)
	if err != nil {
		f.t.Fatalf("pidfd_open: %v", err)
	}
	defer unix.Close(pfd)
	fd, err := unix.PidfdGetfd(pfd, f.ufd, 0)
	if err != nil {
		f.t.Fatalf("pidfd_getfd: %v", err)
	}
	f.t.Cleanup(func() { unix.Close(fd) })
	if _, _, err := uffdio.API(fd, uffdio.Features); err != nil {
		f.t.Fatal(err)
	}
	f.do("close")
	return fd
}

// runPager runs p in the background; the returned channel yields Run's
// result. As restore does, once Run has succeeded it unregisters
// [base, base+size) at once, so that faults on holes go to the kernel.
// The cleanup cancels and waits.
// servePattern starts the fixture with size bytes registered, cut into
// extents of block bytes of the pattern source, and runs a pager on it
// with the options that opts makes for the region at base.
func servePattern(t *testing.T, size uint64, opts func(base uint64) Options) (f *target, base uint64, m mem, p *Pager, errc <-chan error) {
	t.Helper()
	f, fd, base := startRegistered(t, size)
	ext := cut(base, block, int(size/block))
	src := newPatternSrc(ext)
	m = newMem(base, size, ext, src)
	o := opts(base)
	o.Logger = testLogger(t)
	p = New(fd, src, ext, o)
	return f, base, m, p, runPager(t, p, fd, base, size, time.Minute)
}

func runPager(t *testing.T, p *Pager, fd int, base, size uint64, timeout time.Duration) <-chan error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	errc := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := p.Run(ctx)
		if err == nil && !p.Stats().Exited { // no address space: nothing to unregister
			err = uffdio.Unregister(fd, base, size)
		}
		errc <- err
		drainEvents(ctx, fd)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		p.Close()
	})
	return errc
}

// drainEvents reads fd's messages until ctx is done, closing the
// userfaultfds of forked children. The tests keep the userfaultfd open
// after Run (restore closes it at once): an event raised just before the
// unregister, such as a fork that the process started as the pager
// finished, would otherwise leave the process waiting in the kernel for
// a reader.
func drainEvents(ctx context.Context, fd int) {
	buf := make([]byte, 16*uffdio.MsgSize)
	for ctx.Err() == nil {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(p, 20); err != nil || n == 0 {
			continue
		}
		n, err := uffdio.ReadMsgs(fd, buf)
		if err != nil {
			return
		}
		for i := range n {
			if m, err := uffdio.DecodeMsg(buf[i*uffdio.MsgSize:]); err == nil && m.Event == uffdio.EventFork {
				unix.Close(m.UFD)
			}
		}
	}
}

func waitRun(t *testing.T, errc <-chan error, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(timeout):
		t.Fatalf("pager still running after %v", timeout)
	}
	return nil
}

// mem is the test's model of the fixture's memory: page -> contents (nil
// for zeros); pages absent from the map are unmapped.
type mem map[uint64][]byte

func newMem(base, size uint64, ext []Extent, src *patternSrc) mem {
	m := mem{}
	for a := base; a < base+size; a += PageSize {
		m[a] = nil
	}
	for _, e := range ext {
		for a := e.Addr; a < e.End(); a += PageSize {
			p := make([]byte, PageSize)
			src.fill(p, a)
			m[a] = p
		}
	}
	return m
}

func (m mem) zero(a, n uint64) {
	for p := a; p < a+n; p += PageSize {
		m[p] = nil
	}
}

func (m mem) unmap(a, n uint64) {
	for p := a; p < a+n; p += PageSize {
		delete(m, p)
	}
}

func (m mem) fill(a, n uint64, b byte) {
	for p := a; p < a+n; p += PageSize {
		buf := make([]byte, PageSize)
		for i := range buf {
			buf[i] = b
		}
		m[p] = buf
	}
}

func (m mem) move(from, to, n uint64) {
	moved := map[uint64][]byte{}
	for p := from; p < from+n; p += PageSize {
		moved[p-from+to] = m[p]
		delete(m, p)
	}
	for k, v := range moved {
		m[k] = v
	}
}

func (m mem) hash(t testing.TB, a, n uint64) uint64 {
	t.Helper()
	h := uint64(14695981039346656037)
	zero := make([]byte, PageSize)
	for p := a; p < a+n; p += PageSize {
		b, ok := m[p]
		if !ok {
			t.Fatalf("model: page %#x is not mapped", p)
		}
		if b == nil {
			b = zero
		}
		for i := 0; i < PageSize; i += 8 {
			h ^= leUint64(b[i:])
			h *= 1099511628211
		}
	}
	return h
}

func leUint64(b []byte) uint64 {
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// checkSum has the fixture sum [a, a+n) and compares with the model.
func (f *target) checkSum(m mem, what string, a, n uint64) {
	f.t.Helper()
	got := f.do("sum %x %x", a, n)
	if want := m.hash(f.t, a, n); got[0] != want {
		f.t.Fatalf("%s: fixture sum of %#x+%#x = %016x, want %016x", what, a, n, got[0], want)
	}
}
