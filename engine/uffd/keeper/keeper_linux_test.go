package keeper

import (
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/helper"
)

// TestMain lets the test binary run as a keeper (Start executes it again
// with argv[0] Arg0).
func TestMain(m *testing.M) {
	helper.Main()
	os.Exit(m.Run())
}

func startTestKeeper(t *testing.T) *Keeper {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	k, err := Start(exe)
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
	if err := k.Ready(10 * time.Second); err != nil {
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
