package e2e

// Pseudo-terminal pairs inside a tree (test/fixtures/ptyjob.c: a terminal
// server and the job it runs on a pty, as tmux, screen or sshd run a
// shell): after a restore, eager or lazy, the job reads the line that was
// half typed at the dump, the server reads the echo it had not read yet,
// the window is the same size, and the job's controlling terminal is the
// new pair, its group in the foreground, so that ^C reaches it.

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

func TestRestorePtyPair(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	buildTool(t, "snapctl")
	for _, mode := range []string{"eager", "lazy"} {
		t.Run(mode, func(t *testing.T) {
			ctx := testContext(t)
			p := fixture.Start(t, "ptyjob")
			child := p.Ready.MustInt(t, "child")
			// The job leads a session of its own: the harness's group
			// kill does not reach it.
			t.Cleanup(func() { unix.Kill(int(child), unix.SIGKILL) })
			waitTree(t, ctx, p.PID, 2)
			request(t, ctx, p, syscall.SIGUSR2, "typed")
			dir, si := dumpForRestore(t, ctx, p)
			var master bool
			for _, f := range si.State.FDs {
				if pt := f.Pty; pt != nil && pt.Master && pt.State != nil {
					master = pt.State.Winsize.Row == 33 && string(pt.State.Input) == "partial" && string(pt.State.Output) == "partial"
				}
			}
			if !master {
				t.Errorf("the server's state holds no master with the window and the half-typed line: %+v", si.State.FDs)
			}
			var flags []string
			if mode == "lazy" {
				flags = append(flags, "--lazy")
			}
			restoreAndAdopt(t, p, dir, flags...)
			r := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
			for k, want := range map[string]string{"got": "partial_line", "echo": "1", "size": "33x101", "fg": "1", "intr": "1"} {
				wantField(t, r, k, want)
			}
			// The job's terminal is the new pair's slave.
			link := readProcLink(t, int(child), "0")
			if n, err := strconv.Atoi(link[len("/dev/pts/"):]); err != nil || link[:len("/dev/pts/")] != "/dev/pts/" || n < 0 {
				t.Errorf("the job's stdin is %q, not a pseudo-terminal", link)
			}
			lazyKill(t, ctx, p)
		})
	}
	t.Run("slave held outside", func(t *testing.T) {
		ctx := testContext(t)
		p := fixture.Start(t, "ptyjob")
		child := p.Ready.MustInt(t, "child")
		t.Cleanup(func() { unix.Kill(int(child), unix.SIGKILL) })
		// This test holds the job's terminal too, as a process the dump
		// leaves out would: it would keep the old pair.
		slave := readProcLink(t, int(child), "0")
		f, err := os.OpenFile(slave, os.O_RDWR|unix.O_NOCTTY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		refused(t, p.PID, filepath.Join(t.TempDir(), "snap"), exitUnsupported, slave, "pid "+strconv.Itoa(os.Getpid()), "outside")
		answersNormally(t, ctx, p, syscall.SIGUSR2, "typed")
	})
}
