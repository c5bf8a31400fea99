package ptrace

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/test/testutil"
	"golang.org/x/sys/unix"
)

// C fixtures, compiled with gcc into one directory per test binary run.
var fixtureSrc = map[string]string{
	// A single thread spinning (not in a system call), printing progress.
	"loop": `
#include <stdio.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/rseq.h>
int main(void) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	uint64_t ta = 0;
	prctl(PR_GET_TID_ADDRESS, &ta);
	printf("ready tidaddr=%#lx rseq=%#lx\n", (unsigned long)ta,
	       (unsigned long)((char *)__builtin_thread_pointer() + __rseq_offset));
	struct timespec last, now;
	clock_gettime(CLOCK_MONOTONIC, &last);
	volatile unsigned long n = 0;
	for (unsigned long tick = 0;;) {
		n++;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((now.tv_sec - last.tv_sec) * 1000000000L + now.tv_nsec - last.tv_nsec > 20000000L) {
			printf("tick %lu\n", tick++);
			last = now;
		}
	}
}`,
	// Main plus 4 threads; each reports its tid, tid address and rseq area.
	"threads": `
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/rseq.h>
#include <sys/syscall.h>
static volatile unsigned long count[4];
static void report(const char *who) {
	uint64_t ta = 0;
	prctl(PR_GET_TID_ADDRESS, &ta);
	printf("%s tid=%ld tidaddr=%#lx rseq=%#lx\n", who, (long)syscall(SYS_gettid), (unsigned long)ta,
	       (unsigned long)((char *)__builtin_thread_pointer() + __rseq_offset));
}
static void *worker(void *arg) {
	report("thread");
	for (;;) { count[(long)arg]++; usleep(1000); }
}
int main(void) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	report("main");
	pthread_t t[4];
	for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, (void *)i);
	usleep(50000);
	printf("ready\n");
	for (unsigned long tick = 0;; tick++) {
		usleep(20000);
		printf("tick %lu %lu\n", tick, count[0] + count[1] + count[2] + count[3]);
	}
}`,
	// Blocked in nanosleep most of the time.
	"sleeper": `
#include <stdio.h>
#include <time.h>
int main(void) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready\n");
	for (unsigned long tick = 0;; tick++) {
		struct timespec ts = {0, 300 * 1000000L};
		int r = nanosleep(&ts, NULL);
		printf("tick %lu r=%d\n", tick, r);
	}
}`,
	// Blocked in read() on stdin (a pipe); echoes what it reads.
	"piper": `
#include <errno.h>
#include <stdio.h>
#include <unistd.h>
int main(void) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready\n");
	char b[256];
	for (;;) {
		ssize_t n = read(0, b, sizeof b);
		if (n < 0) { printf("read error errno=%d\n", errno); continue; }
		if (n == 0) { printf("eof\n"); return 0; }
		printf("got %.*s\n", (int)n, b);
	}
}`,
	// Signal handlers and an alternate stack.
	"sigs": `
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
static volatile sig_atomic_t usr1;
static void h1(int s, siginfo_t *si, void *u) { usr1++; }
static void h2(int s) {}
static char alt[65536];
int main(void) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct sigaction sa = {0};
	sa.sa_sigaction = h1;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sigaddset(&sa.sa_mask, SIGUSR2);
	sigaction(SIGUSR1, &sa, NULL);
	struct sigaction sb = {0};
	sb.sa_handler = h2;
	sb.sa_flags = SA_ONSTACK;
	sigemptyset(&sb.sa_mask);
	sigaction(SIGTERM, &sb, NULL);
	signal(SIGPIPE, SIG_IGN);
	stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt};
	sigaltstack(&ss, NULL);
	printf("ready h1=%p h2=%p alt=%p altsize=%zu\n", (void *)h1, (void *)h2, (void *)alt, sizeof alt);
	int last = -1;
	for (;;) {
		usleep(2000);
		if (usr1 != last) { last = usr1; printf("usr1=%d\n", last); }
	}
}`,
	// Blocked in ppoll with a temporary signal mask (SIGUSR2 blocked).
	"ppoll": `
#define _GNU_SOURCE
#include <poll.h>
#include <signal.h>
#include <stdio.h>
int main(void) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready\n");
	sigset_t m;
	sigemptyset(&m);
	sigaddset(&m, SIGUSR2);
	for (unsigned long tick = 0;; tick++) {
		struct timespec ts = {0, 100 * 1000000L};
		int r = ppoll(NULL, 0, &ts, &m);
		printf("tick %lu r=%d\n", tick, r);
	}
}`,
	// Threads created and exiting all the time.
	"churn": `
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
static void *worker(void *a) { volatile int x = 0; for (int i = 0; i < 20000; i++) x += i; return NULL; }
static void *spawner(void *a) {
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	for (;;) {
		pthread_t t;
		if (pthread_create(&t, &at, worker, NULL) != 0) usleep(100);
	}
}
int main(void) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	pthread_t t;
	for (int i = 0; i < 3; i++) pthread_create(&t, NULL, spawner, NULL);
	printf("ready\n");
	for (unsigned long tick = 0;; tick++) { usleep(20000); printf("tick %lu\n", tick); }
}`,
}

var (
	fixtureDir  string
	fixtureMu   sync.Mutex
	fixtureBins = map[string]string{}
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ptrace-fixtures-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fixtureDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// fixture compiles (once) and returns the path of fixture name.
func fixture(t testing.TB, name string) string {
	t.Helper()
	testutil.RequireCommand(t, "gcc")
	fixtureMu.Lock()
	defer fixtureMu.Unlock()
	if bin, ok := fixtureBins[name]; ok {
		return bin
	}
	src := filepath.Join(fixtureDir, name+".c")
	bin := filepath.Join(fixtureDir, name)
	if err := os.WriteFile(src, []byte(fixtureSrc[name]), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("gcc", "-O1", "-pthread", "-o", bin, src).CombinedOutput()
	if err != nil {
		t.Fatalf("gcc %s: %v\n%s", name, err, out)
	}
	fixtureBins[name] = bin
	return bin
}

// child is a running fixture with its output as lines.
type child struct {
	cmd    *exec.Cmd
	pid    int
	stdin  io.WriteCloser
	lines  chan string
	before []string // lines printed before "ready"
}

// start runs fixture name, waits for its "ready" line and returns it. The
// process is killed and reaped in t.Cleanup.
func start(t testing.TB, name string) (*child, string) {
	t.Helper()
	cmd := exec.Command(fixture(t, name))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, pid: cmd.Process.Pid, stdin: stdin, lines: make(chan string, 4096)}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("pid %d not reaped 10s after SIGKILL", c.pid)
		}
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case c.lines <- sc.Text():
			default: // nobody reads: drop
			}
		}
		close(c.lines)
	}()
	timer := time.NewTimer(5 * time.Second)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("%s: output ended before ready", name)
			}
			if strings.HasPrefix(l, "ready") {
				return c, l
			}
			c.before = append(c.before, l)
		case <-timer.C:
			t.Fatalf("%s: not ready within 5s", name)
		}
	}
}

// expect returns the next line starting with prefix, within d.
func (c *child) expect(t testing.TB, prefix string, d time.Duration) string {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("pid %d: output ended waiting for %q", c.pid, prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timer.C:
			t.Fatalf("pid %d: no %q line within %v", c.pid, prefix, d)
		}
	}
}

// drain forgets the lines printed so far.
func (c *child) drain() {
	for {
		select {
		case <-c.lines:
		default:
			return
		}
	}
}

// field returns the value of key=value in line as a number (base 0).
func field(t testing.TB, line, key string) uint64 {
	t.Helper()
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			n, err := strconv.ParseUint(v, 0, 64)
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("no %s= in %q", key, line)
	return 0
}

// newTracer returns a Tracer closed in t.Cleanup, after checking ptrace is
// allowed.
func newTracer(t testing.TB) *Tracer {
	t.Helper()
	testutil.RequirePtrace(t)
	tr, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// taskStates returns tid -> state letter from /proc/PID/task/*/stat.
func taskStates(t testing.TB, pid int) map[int]byte {
	t.Helper()
	tids, err := proc.Tasks(pid)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[int]byte, len(tids))
	for _, tid := range tids {
		st, err := proc.ReadTaskStat(pid, tid)
		if errors.Is(err, os.ErrNotExist) {
			continue // exited
		}
		if err != nil {
			t.Fatal(err)
		}
		out[tid] = st.State
	}
	return out
}

// requireFrozen checks that every task of pid is in tracing stop and held
// by p.
func requireFrozen(t testing.TB, p *Process) {
	t.Helper()
	held := map[int]bool{}
	for _, th := range p.Threads() {
		held[th.Tid()] = true
	}
	for tid, st := range taskStates(t, p.Pid()) {
		if st != 't' {
			t.Errorf("task %d state %c, want t (tracing stop)", tid, st)
		}
		if !held[tid] {
			t.Errorf("task %d not in Threads()", tid)
		}
	}
}

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

var _ = unix.SIGKILL
