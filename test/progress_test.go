package e2e

// Progress on a terminal: a 4 GiB dump and its eager restore, with their
// standard error on a pseudo-terminal, repaint the progress line at most
// about ten times a second, with the rate and the time left, and end it
// with a newline; with standard error not a terminal, no progress at all.

import (
	"bytes"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// onTerminal runs snapctl with args, its standard error on a new
// pseudo-terminal, and returns what the terminal showed and how long the
// command ran.
func onTerminal(t *testing.T, args ...string) (string, time.Duration) {
	t.Helper()
	m, s := openPTYPair(t)
	var shown bytes.Buffer
	read := make(chan struct{})
	go func() { io.Copy(&shown, m); close(read) }()
	cmd := exec.CommandContext(testContext(t), buildTool(t, "snapctl"), args...)
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, s
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	s.Close() // the master reads EIO once no slave is open
	<-read
	if err != nil {
		t.Fatalf("snapctl %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), shown.String())
	}
	return shown.String(), took
}

func TestProgressOnTerminal(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.Start(t, "counter", "4G")
	dir := filepath.Join(t.TempDir(), "snap")
	for _, c := range []struct {
		what string
		args []string
	}{
		{"dump", []string{"dump", "-t", strconv.Itoa(p.PID), "-D", dir}},
		{"restore", []string{"restore", "-D", dir}},
	} {
		shown, took := onTerminal(t, c.args...)
		// A repaint is a carriage return not ending a line (the
		// terminal turns each newline into CR LF).
		repaints := strings.Count(shown, "\r") - strings.Count(shown, "\r\n")
		t.Logf("%s: %v, %d repaints, %d bytes on the terminal", c.what, took.Round(time.Millisecond), repaints, len(shown))
		if took < 1200*time.Millisecond {
			t.Fatalf("%s took %v: too quick to show progress (it starts after 1 s); the test needs a bigger process", c.what, took)
		}
		if max := int(took.Seconds()*10) + 2; repaints < 1 || repaints > max {
			t.Errorf("%s: %d repaints in %v, want 1 to %d", c.what, repaints, took, max)
		}
		last := shown[strings.LastIndex(strings.TrimRight(shown, "\r\n"), "\r")+1:]
		if !strings.Contains(last, "(100%)") || !strings.Contains(last, "/s") {
			t.Errorf("%s: last progress line %q: want 100%% and the rate", c.what, last)
		}
		if !strings.Contains(shown, " left") {
			t.Errorf("%s: no time left shown:\n%q", c.what, shown)
		}
		if c.what == "restore" {
			if err := p.Adopt(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Not on a terminal: no progress.
	dir2 := filepath.Join(t.TempDir(), "snap2")
	r := mustSnapctl(t, "dump", "-t", strconv.Itoa(p.PID), "-D", dir2)
	if strings.Contains(r.Stderr, "%") || strings.Contains(r.Stderr, "\r") {
		t.Errorf("dump with standard error not a terminal printed progress:\n%q", r.Stderr)
	}
	if err := p.Kill(ctx); err != nil {
		t.Fatal(err)
	}
}
