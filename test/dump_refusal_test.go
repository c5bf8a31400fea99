package e2e

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
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// holderScript is a Python fixture (same protocol as test/fixtures) that
// holds something a dump refuses: "inotify" an inotify descriptor,
// "child" a child process (refused when traced), "zombie" a child that
// exited and is not reaped. SIGUSR1 -> report sig seq.
const holderScript = `
import ctypes, os, signal, socket, sys, time

def emit(line):
    os.write(1, (line + "\n").encode())

libc = ctypes.CDLL(None, use_errno=True)
mode = sys.argv[1]
extra = ""
# One descriptor of each kind a dump refuses; each returns the fd.
def uring():
    params = ctypes.create_string_buffer(120)
    return libc.syscall(425, 4, params)  # io_uring_setup
kinds = {
    "fanotify": lambda: libc.fanotify_init(0, os.O_RDONLY),
    "netlink": lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).detach(),
    "packet": lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).detach(),
    "pidfd": lambda: os.pidfd_open(os.getpid()),
    "io_uring": uring,
    "userfaultfd": lambda: libc.syscall(323, os.O_CLOEXEC),
    "fuse": lambda: os.open("/dev/fuse", os.O_RDWR),
    "kmsg": lambda: os.open("/dev/kmsg", os.O_RDONLY),
}
if mode == "inotify":
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0 or libc.inotify_add_watch(fd, b".", 0x100) < 0:
        emit("error what=inotify errno=%d" % ctypes.get_errno())
        sys.exit(2)
    extra = "fd=%d" % fd
elif mode in kinds:
    fd = kinds[mode]()
    if fd < 0:
        emit("error what=%s errno=%d" % (mode, ctypes.get_errno()))
        sys.exit(2)
    extra = "fd=%d" % fd
elif mode == "child":
    pid = os.fork()
    if pid == 0:
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        while True:
            signal.pause()
    extra = "child=%d" % pid
elif mode == "zombie":
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    while open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    extra = "child=%d" % pid

seq = 0
def on_usr1(signum, frame):
    global seq
    seq += 1
signal.signal(signal.SIGUSR1, on_usr1)
emit("ready pid=%d mode=%s %s" % (os.getpid(), mode, extra))
answered = 0
while True:
    if seq != answered:
        answered = seq
        emit("report sig=%d seq=%d" % (signal.SIGUSR1, answered))
    time.sleep(0.005)
`

// holdTracedEnv makes the test binary, run again by holdTraced, a tracer
// of another process (TestMain calls tracerMain).
const holdTracedEnv = "LAZYFS_E2E_HOLD_TRACED"

// holdTraced starts a copy of the test binary that seizes pid with
// engine/ptrace and lets it run traced until releaseTraced. The tracer is
// another process: a test cannot trace its own child, whose ptrace stops
// its exec.Cmd's wait would take.
func holdTraced(t *testing.T, pid int) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), holdTracedEnv+"="+strconv.Itoa(pid))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmd.Cancel = stdin.Close
	t.Cleanup(func() {
		stdin.Close()
		timer := time.AfterFunc(10*time.Second, func() { cmd.Process.Kill() })
		defer timer.Stop()
		cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		b, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- b
	}()
	select {
	case l := <-line:
		if strings.TrimSpace(l) != "traced" {
			t.Fatalf("tracer: %q\n%s", l, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("tracer did not seize %d in time\n%s", pid, stderr.String())
	}
	return cmd
}

// releaseTraced makes the tracer of holdTraced detach and exit.
func releaseTraced(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Cancel(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("tracer: %v", err)
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("tracer did not detach in time")
	}
}

// tracerMain is the body of the tracer process: seize the pid, let it
// run, print "traced", and detach when stdin closes.
func tracerMain(arg string) int {
	pid, err := strconv.Atoi(arg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tracer:", err)
		return 2
	}
	tr, err := ptrace.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tracer:", err)
		return 1
	}
	defer tr.Close()
	p, err := tr.Seize(pid, ptrace.SeizeOptions{Timeout: 10 * time.Second})
	if err == nil {
		err = p.Resume()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tracer:", err)
		return 1
	}
	fmt.Println("traced")
	io.Copy(io.Discard, os.Stdin)
	if err := p.Detach(); err != nil {
		fmt.Fprintln(os.Stderr, "tracer: detach:", err)
		return 1
	}
	return 0
}

// startHolder starts holderScript in mode.
func startHolder(t *testing.T, mode string) *fixture.Proc {
	t.Helper()
	script := filepath.Join(t.TempDir(), "holder.py")
	if err := os.WriteFile(script, []byte(holderScript), 0o644); err != nil {
		t.Fatal(err)
	}
	return fixture.StartPython(t, script, mode)
}

// refused runs a dump that must fail: exit status code, one error line
// on stderr that names every one of names, and no snapshot in dir, nor
// dir itself if it was not there before.
func refused(t *testing.T, pid int, dir string, code int, names ...string) cmdResult {
	t.Helper()
	_, err := os.Stat(dir)
	existed := err == nil
	r := runSnapctl(t, "dump", "-t", strconv.Itoa(pid), "-D", dir)
	if r.Code != code {
		t.Fatalf("dump exit status %d, want %d:\n%s", r.Code, code, r)
	}
	msg := strings.TrimSpace(r.Stderr)
	if strings.Count(msg, "\n") != 0 || !strings.HasPrefix(msg, "snapctl: ") {
		t.Errorf("want one error line, got:\n%s", r.Stderr)
	}
	for _, n := range names {
		if !strings.Contains(msg, n) {
			t.Errorf("error %q does not name %q", msg, n)
		}
	}
	if hasManifest(t, dir) {
		t.Errorf("a refused dump left a manifest in %s", dir)
	}
	if _, err := os.Stat(dir); !existed && !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused dump left the directory it made, %s (%v)", dir, err)
	}
	t.Logf("%s", msg)
	return r
}

func TestDumpRefusals(t *testing.T) {
	testutil.RequirePtrace(t)

	t.Run("no-such-process", func(t *testing.T) {
		// The pid of a process that ran and was reaped.
		cmd := exec.Command("true")
		if err := cmd.Run(); err != nil {
			t.Fatal(err)
		}
		pid := cmd.Process.Pid
		dir := filepath.Join(t.TempDir(), "snap")
		refused(t, pid, dir, exitNoProcess, "pid "+strconv.Itoa(pid))
	})

	t.Run("zombie-child", func(t *testing.T) {
		ctx := testContext(t)
		p := startHolder(t, "zombie")
		child := int(p.Ready.MustInt(t, "child"))
		// Kept as the parent's unreaped child, not as a process: the
		// dump succeeds and holds the parent alone, with the child
		// among its zombies (TestZombiesRestored restores them).
		dir := filepath.Join(t.TempDir(), "snap")
		r := mustSnapctl(t, "dump", "-v", "-t", strconv.Itoa(p.PID), "-D", dir, "--leave-running")
		if !strings.Contains(r.Stderr, "not reaped") || !strings.Contains(r.Stderr, fmt.Sprintf("pid=%d", child)) {
			t.Errorf("the dump does not say it kept zombie %d as such\n%s", child, r)
		}
		img := openImage(t, dir, p.PID)
		if pids := img.Snap.PIDs(); len(pids) != 1 || pids[0] != p.PID {
			t.Errorf("snapshot holds %v, want the parent %d alone", pids, p.PID)
		}
		if z := img.State.Zombies; len(z) != 1 || z[0].PID != child || !z[0].Exited() || z[0].Status != 0 {
			t.Errorf("the parent's unreaped children: %+v, want pid %d, exited 0", z, child)
		}
		answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	})

	t.Run("traced-child", func(t *testing.T) {
		// A process of the tree stopped by a debugger (or only traced):
		// refused by name, the tree left running as it was.
		ctx := testContext(t)
		p := startHolder(t, "child")
		child := int(p.Ready.MustInt(t, "child"))
		t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
		tracer := holdTraced(t, child)
		refused(t, p.PID, filepath.Join(t.TempDir(), "snap"), exitUnsupported,
			fmt.Sprintf("pid %d (", child), fmt.Sprintf("child of %d", p.PID), fmt.Sprintf("pid %d", tracer.Process.Pid))
		answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
		releaseTraced(t, tracer)
	})

	t.Run("already-traced", func(t *testing.T) {
		ctx := testContext(t)
		p := fixture.Start(t, "counter", "1M")
		tracer := holdTraced(t, p.PID)
		// TracerPid is the tracer's thread, a thread of the tracer process.
		tid, _ := strconv.Atoi(procStatus(t, p.PID)["TracerPid"])
		if tid == 0 || procStatus(t, tid)["Tgid"] != strconv.Itoa(tracer.Process.Pid) {
			t.Fatalf("the tracer %d did not seize %d (TracerPid %d)", tracer.Process.Pid, p.PID, tid)
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", tracer.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		refused(t, p.PID, filepath.Join(t.TempDir(), "snap"), exitUnsupported,
			fmt.Sprintf("pid %d (%s)", tracer.Process.Pid, strings.TrimSpace(string(comm))))
		// Still traced by the other tracer, still running: it passes
		// the request on.
		if st := procStatus(t, p.PID); st["TracerPid"] != strconv.Itoa(tid) {
			t.Errorf("TracerPid %s after the refused dump, want %d", st["TracerPid"], tid)
		}
		request(t, ctx, p, syscall.SIGUSR1, "report")
		releaseTraced(t, tracer)
		answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	})

	t.Run("snapshot-exists", func(t *testing.T) {
		ctx := testContext(t)
		p := fixture.Start(t, "counter", "1M")
		dir := filepath.Join(t.TempDir(), "snap")
		dumpPID(t, p.PID, dir, "--leave-running")
		manifest, err := os.ReadFile(filepath.Join(dir, "snapshot.json"))
		if err != nil {
			t.Fatal(err)
		}
		r := runSnapctl(t, "dump", "-t", strconv.Itoa(p.PID), "-D", dir)
		if r.Code != exitFailure || !strings.Contains(r.Stderr, "already holds a snapshot") {
			t.Errorf("second dump into %s:\n%s", dir, r)
		}
		if again, err := os.ReadFile(filepath.Join(dir, "snapshot.json")); err != nil || string(again) != string(manifest) {
			t.Errorf("the refused dump changed the snapshot's manifest (%v)", err)
		}
		verifyDir(t, dir)
		answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	})

	t.Run("disk-full", func(t *testing.T) {
		// A 16 MiB tmpfs cannot hold the ~50 MiB image of a 64 MiB
		// counter: the write fails in the middle of the pages file.
		testutil.RequireRoot(t)
		ctx := testContext(t)
		p := fixture.Start(t, "counter", "64M")
		fs := t.TempDir()
		if err := unix.Mount("lazyfs-e2e-full", fs, "tmpfs", 0, "size=16m"); err != nil {
			t.Fatalf("mount a small tmpfs: %v", err)
		}
		t.Cleanup(func() {
			if err := unix.Unmount(fs, 0); err != nil {
				t.Errorf("unmount %s: %v", fs, err)
			}
		})
		dir := filepath.Join(fs, "snap")
		// Without --leave-running: a successful dump would kill it.
		pages := "pages-" + strconv.Itoa(p.PID) + ".img"
		r := refused(t, p.PID, dir, exitFailure, filepath.Join(dir, pages), "no space left on device")
		if n := strings.Count(r.Stderr, pages); n != 1 {
			t.Errorf("the error names %s %d times, want once: %s", pages, n, r.Stderr)
		}
		if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
			t.Errorf("the failed dump left files in %s: %v", dir, ents)
		}
		answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	})

	// Every descriptor kind a server may hold that a restore cannot
	// make again is refused, naming the descriptor and its kind; the
	// process goes on as it was.
	for _, kind := range []struct{ mode, name string }{
		{"inotify", "inotify"},
		{"fanotify", "fanotify"},
		{"netlink", "netlink"},
		{"packet", "packet"},
		{"pidfd", "pidfd"},
		{"io_uring", "io_uring"},
		{"userfaultfd", "userfaultfd"},
		{"fuse", "/dev/fuse"},
		{"kmsg", "/dev/kmsg"},
	} {
		t.Run("unsupported-fd/"+kind.mode, func(t *testing.T) {
			ctx := testContext(t)
			p := startHolder(t, kind.mode)
			fd := p.Ready.MustInt(t, "fd")
			dir := filepath.Join(t.TempDir(), "snap")
			// Without --leave-running: a successful dump would kill it.
			refused(t, p.PID, dir, exitUnsupported, "fd "+strconv.FormatInt(fd, 10)+" ", kind.name)
			if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
				t.Errorf("the failed dump left files in %s: %v", dir, ents)
			}
			answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
		})
	}
}
