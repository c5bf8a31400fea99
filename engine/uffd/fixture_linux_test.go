package uffd

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/test/testutil"
)

// fixtureC is a process that creates a userfaultfd for the test to take
// (as restore takes one created in the target by an injected syscall) and
// then works on its memory on command. Commands and numbers are hex; each
// answer is one line, "ok ..." or "err ...".
const fixtureC = `
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t sum(uintptr_t a, size_t n) {
	const volatile uint64_t *p = (const volatile uint64_t *)a;
	uint64_t h = 14695981039346656037ULL;
	for (size_t i = 0; i < n / 8; i++) { h ^= p[i]; h *= 1099511628211ULL; }
	return h;
}
struct job { uintptr_t a; size_t n; uint64_t h; };
static void *sumjob(void *p) { struct job *j = p; j->h = sum(j->a, j->n); return NULL; }
static uint64_t now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000ULL + t.tv_nsec; }
static int cmp(const void *a, const void *b) { uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b; return x < y ? -1 : x > y; }

int main(void) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	int ufd = syscall(323, O_CLOEXEC | O_NONBLOCK);
	if (ufd < 0) { printf("err userfaultfd %d\n", errno); return 1; }
	volatile uint64_t *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	printf("uffd %d\n", ufd);
	char line[256], cmd[32];
	while (fgets(line, sizeof line, stdin)) {
		unsigned long a = 0, b = 0, c = 0;
		if (sscanf(line, "%31s %lx %lx %lx", cmd, &a, &b, &c) < 1) continue;
		if (!strcmp(cmd, "map")) {
			void *m = mmap(NULL, a, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (m == MAP_FAILED) printf("err mmap %d\n", errno); else printf("ok %lx\n", (unsigned long)m);
		} else if (!strcmp(cmd, "remap")) { /* a fresh mapping in place: no registration */
			void *m = mmap((void *)a, b, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
			if (m == MAP_FAILED) printf("err mmap %d\n", errno); else printf("ok %lx\n", (unsigned long)m);
		} else if (!strcmp(cmd, "sum")) {
			printf("ok %016lx\n", (unsigned long)sum(a, b));
		} else if (!strcmp(cmd, "fill")) {
			memset((void *)a, (int)c, b);
			printf("ok\n");
		} else if (!strcmp(cmd, "dontneed")) {
			if (madvise((void *)a, b, MADV_DONTNEED)) printf("err madvise %d\n", errno); else printf("ok\n");
		} else if (!strcmp(cmd, "munmap")) {
			if (munmap((void *)a, b)) printf("err munmap %d\n", errno); else printf("ok\n");
		} else if (!strcmp(cmd, "mprotect")) {
			if (mprotect((void *)a, b, (int)c)) printf("err mprotect %d\n", errno); else printf("ok\n");
		} else if (!strcmp(cmd, "mremap")) {
			void *m = mremap((void *)a, b, b, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)c);
			if (m == MAP_FAILED) printf("err mremap %d\n", errno); else printf("ok %lx\n", (unsigned long)m);
		} else if (!strcmp(cmd, "fork")) { /* the child sums [a, a+b) */
			shared[0] = 0;
			pid_t pid = fork();
			if (pid == 0) { shared[0] = sum(a, b); _exit(0); }
			int st = 0;
			if (pid < 0 || waitpid(pid, &st, 0) < 0) printf("err fork %d\n", errno);
			else printf("ok %016lx %x\n", (unsigned long)shared[0], st);
		} else if (!strcmp(cmd, "psum")) { /* c threads sum [a, a+b) in c slices at once */
			struct job j[16]; pthread_t th[16];
			if (c < 1 || c > 16) c = 1;
			for (unsigned long i = 0; i < c; i++) { j[i].a = a + i * (b / c); j[i].n = b / c; pthread_create(&th[i], NULL, sumjob, &j[i]); }
			printf("ok");
			for (unsigned long i = 0; i < c; i++) { pthread_join(th[i], NULL); printf(" %016lx", (unsigned long)j[i].h); }
			printf("\n");
		} else if (!strcmp(cmd, "churn")) { /* DONTNEED one page every c bytes of [a, a+b) */
			int bad = 0;
			for (uintptr_t p = a; p < a + b; p += c) bad |= madvise((void *)p, 4096, MADV_DONTNEED);
			if (bad) printf("err madvise %d\n", errno); else printf("ok\n");
		} else if (!strcmp(cmd, "close")) {
			close(ufd);
			printf("ok\n");
		} else if (!strcmp(cmd, "cpu")) {
			cpu_set_t s; CPU_ZERO(&s); CPU_SET((int)a, &s);
			if (sched_setaffinity(0, sizeof s, &s)) printf("err affinity %d\n", errno); else printf("ok\n");
		} else if (!strcmp(cmd, "touch")) { /* read one byte every c bytes, time each */
			size_t n = b / c, k = 0;
			uint64_t *t = malloc((n + 1) * sizeof *t), t0 = now();
			volatile char x = 0;
			for (uintptr_t p = a; p < a + b; p += c) { uint64_t s = now(); x += *(volatile char *)p; t[k++] = now() - s; }
			uint64_t tot = now() - t0;
			qsort(t, k, sizeof *t, cmp);
			printf("ok %lx %lx %lx %lx\n", (unsigned long)k, (unsigned long)t[k / 2], (unsigned long)t[k * 99 / 100], (unsigned long)tot);
			free(t);
		} else if (!strcmp(cmd, "exit")) {
			printf("ok\n");
			return 0;
		} else {
			printf("err unknown %s\n", cmd);
		}
	}
	return 0;
}
`

// fixture is a running fixture process.
type fixture struct {
	t     testing.TB
	pid   int
	ufd   int // the userfaultfd's number in the fixture
	in    io.Writer
	lines chan string
}

// buildFixture compiles the fixture into a temporary directory.
func buildFixture(t testing.TB) string {
	t.Helper()
	gcc := testutil.RequireCommand(t, "gcc")
	dir := t.TempDir()
	srcPath, bin := filepath.Join(dir, "fixture.c"), filepath.Join(dir, "fixture")
	if err := os.WriteFile(srcPath, []byte(fixtureC), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-O2", "-Wall", "-pthread", "-o", bin, srcPath).CombinedOutput(); err != nil {
		t.Fatalf("build fixture: %v\n%s", err, out)
	}
	return bin
}

// startFixture runs the fixture in its own process group (its forked
// children die with it in the cleanup).
func startFixture(t testing.TB, bin string) *fixture {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, pid: cmd.Process.Pid, in: in, lines: make(chan string, 16)}
	t.Cleanup(func() {
		unix.Kill(-f.pid, unix.SIGKILL)
		cmd.Wait()
	})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f.lines <- sc.Text()
		}
		close(f.lines)
	}()
	line := f.read(10 * time.Second)
	if _, err := fmt.Sscanf(line, "uffd %d", &f.ufd); err != nil {
		t.Fatalf("fixture start: %q", line)
	}
	return f
}

func (f *fixture) read(timeout time.Duration) string {
	f.t.Helper()
	select {
	case l, ok := <-f.lines:
		if !ok {
			f.t.Fatal("fixture exited")
		}
		return l
	case <-time.After(timeout):
		f.t.Fatalf("fixture: no answer in %v", timeout)
	}
	return ""
}

// send writes a command without waiting for its answer.
func (f *fixture) send(format string, args ...any) {
	f.t.Helper()
	if _, err := fmt.Fprintf(f.in, format+"\n", args...); err != nil {
		f.t.Fatalf("fixture command: %v", err)
	}
}

// do runs a command and returns the fields of its "ok" answer as numbers.
func (f *fixture) do(format string, args ...any) []uint64 {
	f.t.Helper()
	f.send(format, args...)
	return f.answer(format, 20*time.Second)
}

func (f *fixture) answer(what string, timeout time.Duration) []uint64 {
	f.t.Helper()
	line := f.read(timeout)
	fields := strings.Fields(line)
	if len(fields) == 0 || fields[0] != "ok" {
		f.t.Fatalf("fixture %q: %q", what, line)
	}
	var v []uint64
	for _, s := range fields[1:] {
		n, err := strconv.ParseUint(s, 16, 64)
		if err != nil {
			f.t.Fatalf("fixture %q: %q", what, line)
		}
		v = append(v, n)
	}
	return v
}

// takeUffd takes the fixture's userfaultfd (pidfd_getfd, as restore does),
// enables Features, and has the fixture close its own copy.
func (f *fixture) takeUffd() int {
	f.t.Helper()
	pfd, err := unix.PidfdOpen(f.pid, 0)
	if err != nil {
		f.t.Fatalf("pidfd_open: %v", err)
	}
	defer unix.Close(pfd)
	fd, err := unix.PidfdGetfd(pfd, f.ufd, 0)
	if err != nil {
		f.t.Fatalf("pidfd_getfd: %v", err)
	}
	f.t.Cleanup(func() { unix.Close(fd) })
	if _, _, err := API(fd, Features); err != nil {
		f.t.Fatal(err)
	}
	f.do("close")
	return fd
}

// requireFixture skips or fails when the machine cannot run these tests.
func requireFixture(t testing.TB) string {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireUserfaultfd(t)
	return buildFixture(t)
}

// runPager runs p in the background; the returned channel yields Run's
// result. As restore does, once Run has succeeded it unregisters
// [base, base+size) at once, so that faults on holes go to the kernel.
// The cleanup cancels and waits.
func runPager(t *testing.T, p *Pager, fd int, base, size uint64, timeout time.Duration) <-chan error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	errc := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := p.Run(ctx)
		if err == nil && !p.Stats().Exited { // no address space: nothing to unregister
			err = Unregister(fd, base, size)
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
	buf := make([]byte, 16*MsgSize)
	for ctx.Err() == nil {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(p, 20); err != nil || n == 0 {
			continue
		}
		n, err := ReadMsgs(fd, buf)
		if err != nil {
			return
		}
		for i := range n {
			if m, err := DecodeMsg(buf[i*MsgSize:]); err == nil && m.Event == EventFork {
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
func (f *fixture) checkSum(m mem, what string, a, n uint64) {
	f.t.Helper()
	got := f.do("sum %x %x", a, n)
	if want := m.hash(f.t, a, n); got[0] != want {
		f.t.Fatalf("%s: fixture sum of %#x+%#x = %016x, want %016x", what, a, n, got[0], want)
	}
}
