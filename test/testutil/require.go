// Package testutil holds the capability checks shared by lazyfs tests, and
// Output, which runs the command-line tools they read snapshots with.
//
// A test that needs root, FUSE, ptrace, userfaultfd or an external command
// calls the matching Require function first. Where the capability is
// missing the test is skipped with the reason, except when the environment
// variable LAZYFS_TEST_REQUIRE is "all" (as in CI) or names the capability
// in a comma-separated list: then the missing capability fails the test, so
// that CI never reports a pass for a test that did not run.
package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// RequireEnv is the environment variable that turns skips into failures.
const RequireEnv = "LAZYFS_TEST_REQUIRE"

// Capability names, as accepted in LAZYFS_TEST_REQUIRE.
const (
	CapRoot        = "root"
	CapFUSE        = "fuse"
	CapPtrace      = "ptrace"
	CapUserfaultfd = "userfaultfd"
	CapCommand     = "command"
	CapKernel      = "kernel"
)

// required reports whether a missing capability must fail rather than skip.
func required(capability string) bool {
	v := os.Getenv(RequireEnv)
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "all" || f == capability {
			return true
		}
	}
	return false
}

// missing skips t, or fails it when the capability is required.
func missing(t testing.TB, capability, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if required(capability) {
		t.Fatalf("%s required (%s=%s) but unavailable: %s", capability, RequireEnv, os.Getenv(RequireEnv), reason)
	}
	t.Skipf("skipping: %s unavailable: %s (set %s=all to make this a failure)", capability, reason, RequireEnv)
}

// RequireKernel needs a kernel facility that a probe of the caller's found
// missing when probeErr is not nil (what names it).
func RequireKernel(t testing.TB, what string, probeErr error) {
	t.Helper()
	if probeErr != nil {
		missing(t, CapKernel, "%s: %v", what, probeErr)
	}
}

// RequireRoot needs an effective uid of 0.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, CapRoot, "running as uid %d, not root", os.Geteuid())
	}
}

var (
	fuseOnce sync.Once
	fuseErr  error
)

// RequireFUSE needs /dev/fuse to open read-write and fusermount3 (or
// fusermount) on PATH.
func RequireFUSE(t testing.TB) {
	t.Helper()
	fuseOnce.Do(func() {
		fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			fuseErr = fmt.Errorf("open /dev/fuse: %w", err)
			return
		}
		unix.Close(fd)
		if _, err := exec.LookPath("fusermount3"); err != nil {
			if _, err2 := exec.LookPath("fusermount"); err2 != nil {
				fuseErr = fmt.Errorf("fusermount3 not on PATH (install fuse3)")
			}
		}
	})
	if fuseErr != nil {
		missing(t, CapFUSE, "%v", fuseErr)
	}
}

// RequirePtrace needs permission to trace the caller's own children and
// to read other processes' memory: root (CAP_SYS_PTRACE), and Yama's
// ptrace_scope below 3.
func RequirePtrace(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, CapPtrace, "not root: dump and restore trace processes they did not start")
		return
	}
	if b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil && strings.TrimSpace(string(b)) == "3" {
		missing(t, CapPtrace, "kernel.yama.ptrace_scope=3 forbids ptrace")
	}
}

// RequireUserfaultfd needs the userfaultfd syscall, usable by this user.
func RequireUserfaultfd(t testing.TB) {
	t.Helper()
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if errno != 0 {
		missing(t, CapUserfaultfd, "userfaultfd(2): %v", errno)
		return
	}
	unix.Close(int(fd))
}

// RequireCommand needs each named program on PATH and returns the path of
// the first.
func RequireCommand(t testing.TB, names ...string) string {
	t.Helper()
	var first string
	for i, n := range names {
		p, err := exec.LookPath(n)
		if err != nil {
			missing(t, CapCommand, "%s not on PATH", n)
			return ""
		}
		if i == 0 {
			first = p
		}
	}
	return first
}

var (
	pyModMu  sync.Mutex
	pyModErr = map[string]error{}
)

// RequirePythonModule needs python (an interpreter's path) to import
// module: a Debian package such as python3-torch that .ci/setup installs.
func RequirePythonModule(t testing.TB, python, module string) {
	t.Helper()
	pyModMu.Lock()
	err, ok := pyModErr[python+" "+module]
	if !ok {
		if out, e := exec.Command(python, "-I", "-c", "import "+module).CombinedOutput(); e != nil {
			err = fmt.Errorf("%s cannot import %s: %v: %s", python, module, e, strings.TrimSpace(string(out)))
		}
		pyModErr[python+" "+module] = err
	}
	pyModMu.Unlock()
	if err != nil {
		missing(t, CapCommand, "%v", err)
	}
}
