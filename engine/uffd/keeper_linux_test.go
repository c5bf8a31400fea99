package uffd

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain lets the test binary run as a keeper (StartKeeper re-executes
// it with argv[0] KeeperArg0).
func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == KeeperArg0 {
		os.Exit(KeeperMain(os.Args, testSetup))
	}
	os.Exit(m.Run())
}

// testSetup: "pipe" sends back "hello" and the read end of a new pipe;
// "fail" fails.
func testSetup(args []string) ([]byte, []int, func(), error) {
	if len(args) == 0 {
		return nil, nil, nil, nil
	}
	switch args[0] {
	case "pipe":
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			return nil, nil, nil, err
		}
		return []byte("hello"), []int{p[0]}, func() { unix.Close(p[1]) }, nil
	case "fail":
		return nil, nil, nil, errors.New("cannot set up")
	}
	return nil, nil, nil, errors.New("unknown setup")
}

func startTestKeeper(t *testing.T, args ...string) *Keeper {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	k, err := StartKeeper(exe, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// hungUp reports whether the read end rfd of a pipe sees its writers gone
// within wait.
func hungUp(t *testing.T, rfd int, wait time.Duration) bool {
	t.Helper()
	p := []unix.PollFd{{Fd: int32(rfd), Events: unix.POLLIN}}
	n, err := unix.Poll(p, int(wait.Milliseconds()))
	if err != nil && !errors.Is(err, unix.EINTR) {
		t.Fatal(err)
	}
	return n > 0 && p[0].Revents&unix.POLLHUP != 0
}

// TestKeeperHoldsUntilReleased: a held fd outlives our copy until
// Release, and Close makes the keeper drop everything and exit.
func TestKeeperHoldsUntilReleased(t *testing.T) {
	k := startTestKeeper(t)
	if _, _, err := k.Setup(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	var a, b [2]int
	for _, p := range []*[2]int{&a, &b} {
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(p[0]) })
		if err := k.Hold(p[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := k.Release(a[1]); err != nil {
		t.Fatal(err)
	}
	unix.Close(a[1])
	unix.Close(b[1])
	if !hungUp(t, a[0], 5*time.Second) {
		t.Errorf("a released fd is still held")
	}
	if hungUp(t, b[0], 200*time.Millisecond) {
		t.Fatalf("a held fd was closed while held")
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if !hungUp(t, b[0], 0) {
		t.Errorf("the keeper exited without closing what it held")
	}
	if err := k.Hold(b[0]); err == nil {
		t.Errorf("Hold after Close succeeded")
	}
}

// TestKeeperSetup: the setup's reply and fds reach the starter, and its
// cleanup runs when the keeper exits.
func TestKeeperSetup(t *testing.T) {
	k := startTestKeeper(t, "pipe")
	reply, fds, err := k.Setup(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if string(reply) != "hello" || len(fds) != 1 {
		t.Fatalf("setup answered %q with %d fds, want \"hello\" and 1", reply, len(fds))
	}
	defer unix.Close(fds[0])
	if hungUp(t, fds[0], 100*time.Millisecond) {
		t.Fatalf("the pipe's write end is closed before the keeper exits")
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if !hungUp(t, fds[0], 0) {
		t.Errorf("the setup's cleanup did not run")
	}
}

func TestKeeperSetupError(t *testing.T) {
	k := startTestKeeper(t, "fail")
	_, _, err := k.Setup(10 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "cannot set up") {
		t.Fatalf("Setup = %v, want the setup's error", err)
	}
	if err := k.Close(); err == nil {
		t.Errorf("Close of a keeper that failed its setup: no error")
	}
}
