package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/image"
)

// Timeouts of the commands tests run.
const (
	buildTimeout   = 3 * time.Minute
	commandTimeout = 2 * time.Minute
)

// Exit statuses of snapctl and lazyfs (docs/cli.md, Exit status). The tests
// spell them out, as a script would, rather than import them: they are the
// contract, and a failure's status is what the tests check first, its
// message only for the pid, file or block it names.
const (
	exitFailure     = 1
	exitUnsupported = 3
	exitNoProcess   = 4
	exitPIDInUse    = 5
	exitBadSnapshot = 7
	exitUntrusted   = 8
	exitFileChanged = 9
	exitNoPrivilege = 10
)

// tools holds the commands built for this test binary, in a directory
// TestMain creates and removes.
var tools struct {
	dir   string
	mu    sync.Mutex
	built map[string]*toolBuild
}

type toolBuild struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

// buildTool builds the module's command ./cmd/<name> once per test binary
// and returns the path of the binary.
func buildTool(t testing.TB, name string) string {
	t.Helper()
	tools.mu.Lock()
	if tools.built == nil {
		tools.built = map[string]*toolBuild{}
	}
	b := tools.built[name]
	if b == nil {
		b = &toolBuild{}
		tools.built[name] = b
	}
	tools.mu.Unlock()
	b.once.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			b.err = err
			return
		}
		dir := tools.dir
		if dir == "" { // not started through TestMain
			dir = os.TempDir()
		}
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		b.path = filepath.Join(dir, name)
		cmd := exec.CommandContext(ctx, goBin, "build", "-o", b.path, "github.com/lazyfs/lazyfs/cmd/"+name)
		b.out, b.err = cmd.CombinedOutput()
	})
	if b.err != nil {
		t.Fatalf("build %s: %v\n%s", name, b.err, b.out)
	}
	return b.path
}

// cmdResult is the outcome of a command.
type cmdResult struct {
	Args    []string
	Code    int // exit status; -1 if killed by a signal
	Stdout  string
	Stderr  string
	Elapsed time.Duration
}

func (r cmdResult) String() string {
	return strings.Join(r.Args, " ") + ": exit " + strconv.Itoa(r.Code) + "\nstdout:\n" + r.Stdout + "\nstderr:\n" + r.Stderr
}

// runSnapctl runs snapctl with args under commandTimeout and returns its
// exit status and output. It fails the test only when the command cannot
// be run or times out.
func runSnapctl(t testing.TB, args ...string) cmdResult {
	t.Helper()
	return runTool(t, buildTool(t, "snapctl"), commandTimeout, args...)
}

// runTool runs bin with args, killing it after timeout.
func runTool(t testing.TB, bin string, timeout time.Duration, args ...string) cmdResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	res := cmdResult{Args: append([]string{filepath.Base(bin)}, args...), Elapsed: time.Since(start),
		Stdout: stdout.String(), Stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("%s: timed out after %v\n%s", strings.Join(res.Args, " "), timeout, res)
	case errors.As(err, &ee):
		res.Code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run %s: %v", strings.Join(res.Args, " "), err)
	}
	return res
}

// mustSnapctl runs snapctl and fails the test unless it exits 0.
func mustSnapctl(t testing.TB, args ...string) cmdResult {
	t.Helper()
	r := runSnapctl(t, args...)
	if r.Code != 0 {
		t.Fatalf("%s", r)
	}
	return r
}

// dumpPID runs `snapctl dump -t pid -D dir flags...` and fails the test
// unless it succeeds.
func dumpPID(t testing.TB, pid int, dir string, flags ...string) cmdResult {
	t.Helper()
	return mustSnapctl(t, append([]string{"dump", "-t", strconv.Itoa(pid), "-D", dir}, flags...)...)
}

// verifyDir runs `snapctl verify -D dir` and fails the test unless it
// exits 0.
func verifyDir(t testing.TB, dir string) {
	t.Helper()
	r := mustSnapctl(t, "verify", "-D", dir)
	if !strings.Contains(r.Stdout, ": ok") {
		t.Errorf("verify printed no ok:\n%s", r)
	}
}

// hasManifest reports whether dir holds a snapshot manifest.
func hasManifest(t testing.TB, dir string) bool {
	t.Helper()
	_, err := os.Lstat(filepath.Join(dir, image.ManifestName))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}
