package e2e

// Terminals: a server started from an interactive shell (Python's
// http.server on a pseudo-terminal, logging its requests there) is
// refused by a dump without --shell-job; with it, its terminal is
// recorded as leading outside, and restore --shell-job gives it the
// restoring snapctl's terminal, set as its own was, never the old one
// reopened by its name (gone here, as when the shell's window was
// closed): it answers, and logs the request on the new terminal.

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// pty is a pseudo-terminal pair and the lines read from its master.
type pty struct {
	master, slave *os.File
	lines         chan string
}

// openPTY opens a pseudo-terminal pair, closed at cleanup, and reads its
// master's lines in the background.
func openPTY(t *testing.T) *pty {
	t.Helper()
	m, s := openPTYPair(t)
	p := &pty{master: m, slave: s, lines: make(chan string, 256)}
	go func() {
		sc := bufio.NewScanner(m)
		for sc.Scan() {
			select {
			case p.lines <- strings.TrimRight(sc.Text(), "\r"):
			default:
			}
		}
	}()
	return p
}

// openPTYPair opens a pseudo-terminal pair, closed at cleanup: its
// master and its slave.
func openPTYPair(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); m.Close() })
	return m, s
}

// line waits for a line of the terminal that starts with prefix.
func (p *pty) line(t *testing.T, ctx context.Context, prefix string) string {
	t.Helper()
	for {
		select {
		case l := <-p.lines:
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-ctx.Done():
			t.Fatalf("no line %q on the terminal: %v", prefix, ctx.Err())
		}
	}
}

func TestShellJob(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	snapctl := buildTool(t, "snapctl")
	python := testutil.RequireCommand(t, "python3")
	for _, mode := range []string{"eager", "lazy"} {
		t.Run(mode, func(t *testing.T) {
			ctx := testContext(t)
			// The job: the server with the first terminal as its stdio and
			// controlling terminal, as a shell runs a command.
			first := openPTY(t)
			port, err := fixture.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			www := t.TempDir()
			if err := os.WriteFile(www+"/f.txt", []byte("on a terminal\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(python, "-u", "-m", "http.server", "--bind", "127.0.0.1", "--directory", www, strconv.Itoa(port))
			cmd.Stdin, cmd.Stdout, cmd.Stderr = first.slave, first.slave, first.slave
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pid := cmd.Process.Pid
			waited := make(chan struct{})
			go func() { cmd.Wait(); close(waited) }()
			t.Cleanup(func() {
				unix.Kill(pid, unix.SIGKILL)
				<-waited
			})
			first.line(t, ctx, "Serving HTTP")
			get := func() string {
				t.Helper()
				body, err := httpGet(ctx, "http://127.0.0.1:"+strconv.Itoa(port)+"/f.txt")
				if err != nil || body != "on a terminal\n" {
					t.Fatalf("GET /f.txt: %q, %v", body, err)
				}
				return body
			}
			get()
			first.line(t, ctx, "127.0.0.1")
			// The job has set its terminal as an interactive program
			// does: no echo, no line editing, reads of 3 bytes.
			tio, err := unix.IoctlGetTermios(int(first.slave.Fd()), unix.TCGETS)
			if err != nil {
				t.Fatal(err)
			}
			tio.Lflag &^= unix.ECHO | unix.ICANON
			tio.Cc[unix.VMIN] = 3
			if err := unix.IoctlSetTermios(int(first.slave.Fd()), unix.TCSETS, tio); err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir() + "/snap"
			r := runSnapctl(t, "dump", "-t", strconv.Itoa(pid), "-D", dir)
			if r.Code != exitUnsupported || !strings.Contains(r.Stderr, "--shell-job") || !strings.Contains(r.Stderr, first.slave.Name()) {
				t.Fatalf("dump of a process on a terminal without --shell-job: want exit %d naming the terminal and --shell-job\n%s", exitUnsupported, r)
			}
			r = dumpPID(t, pid, dir, "--shell-job")
			t.Logf("%s", strings.TrimSpace(r.Stdout))
			<-waited
			// The terminal goes, as a closed window's does.
			first.slave.Close()
			first.master.Close()

			r = runSnapctl(t, "restore", "-D", dir)
			wantRefused(t, ctx, r, exitUnsupported, pid, "terminal", "--shell-job")

			second := openPTY(t)
			args := []string{"restore", "-D", dir, "--shell-job"}
			if mode == "lazy" {
				args = append(args, "--lazy")
			}
			rc := exec.CommandContext(ctx, snapctl, args...)
			rc.Stdin, rc.Stdout, rc.Stderr = second.slave, second.slave, second.slave
			if err := rc.Run(); err != nil {
				t.Fatalf("snapctl %s: %v", strings.Join(args, " "), err)
			}
			t.Cleanup(func() { unix.Kill(pid, unix.SIGKILL) })
			restored := second.line(t, ctx, "restored pid")
			t.Logf("%s", restored)
			for fd := range 3 {
				link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd))
				if err != nil || link != second.slave.Name() {
					t.Errorf("fd %d of the restored job is %q (%v), want snapctl's terminal %s", fd, link, err, second.slave.Name())
				}
			}
			// It answers, and logs the request on its new terminal, set as
			// its own was.
			get()
			tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			t.Logf("on the new terminal: %s", second.line(t, tctx, "127.0.0.1"))
			got, err := unix.IoctlGetTermios(int(second.slave.Fd()), unix.TCGETS)
			if err != nil {
				t.Fatal(err)
			}
			if got.Lflag&(unix.ECHO|unix.ICANON) != 0 || got.Cc[unix.VMIN] != 3 {
				t.Errorf("snapctl's terminal after restore --shell-job: lflag %#o, VMIN %d; want the job's settings (no ECHO, no ICANON, VMIN 3)", got.Lflag, got.Cc[unix.VMIN])
			}
		})
	}
}
