package helper

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const testArg0 = "lazyfs-helper-test"

// testMain is a helper: "ok" answers "hello" and the read end of a pipe
// whose write end it keeps until the starter goes; "fail" fails; "exit"
// exits without a word.
func testMain(args []string) int {
	st, rest, code, ok := Attach(args)
	if !ok {
		return code
	}
	switch rest[0] {
	case "ok":
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			st.Fail(err)
			return 1
		}
		if err := st.Ready([]byte("hello"), []int{p[0]}); err != nil {
			return 1
		}
		st.Wait()
		return 0
	case "fail":
		st.Fail(errors.New("cannot set up"))
		return 1
	}
	return 3
}

func TestMain(m *testing.M) {
	Register(testArg0, testMain)
	Main()
	os.Exit(m.Run())
}

func start(t *testing.T, arg string) *Child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c, err := Start(exe, testArg0, []string{arg}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(); <-c.Exited() })
	return c
}

// TestProtocol: the reply and descriptors of a helper set up, the error
// of one that failed, the exit of one that said nothing; a helper ends
// when its starter closes its end.
func TestProtocol(t *testing.T) {
	c := start(t, "ok")
	reply, fds, err := c.Setup(10*time.Second, 1)
	if err != nil || string(reply) != "hello" || len(fds) != 1 {
		t.Fatalf("Setup = %q, %v, %v; want hello and one fd", reply, fds, err)
	}
	defer CloseAll(fds)
	p := []unix.PollFd{{Fd: int32(fds[0]), Events: unix.POLLIN}}
	if n, _ := unix.Poll(p, 100); n != 0 {
		t.Fatal("the pipe's write end closed while the helper runs")
	}
	c.CloseSocket()
	select {
	case <-c.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the helper did not end when its starter closed its end")
	}
	if err := c.ExitErr(); err != nil {
		t.Errorf("helper exited with %v", err)
	}

	if _, _, err := start(t, "fail").Setup(10*time.Second, 1); err == nil || !strings.Contains(err.Error(), "cannot set up") {
		t.Errorf("a helper that failed: Setup = %v", err)
	}
	if _, _, err := start(t, "exit").Setup(10*time.Second, 1); !errors.Is(err, ErrExited) {
		t.Errorf("a helper that exited: Setup = %v, want ErrExited", err)
	}
}

func TestAttachRefuses(t *testing.T) {
	for _, args := range [][]string{{testArg0}, {testArg0, "x"}, {testArg0, "0"}} {
		if _, _, code, ok := Attach(args); ok || code != 2 {
			t.Errorf("Attach(%q) = %v, %d; want exit 2", args, ok, code)
		}
	}
	// A starter that is not our parent: gone, nobody to serve.
	if _, _, code, ok := Attach([]string{testArg0, "1"}); ok || code != 0 {
		t.Errorf("Attach of a pid not our parent = %v, %d; want exit 0", ok, code)
	}
}

func TestRegisterTwice(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("a second Register of one name did not panic")
		}
	}()
	Register(testArg0, testMain)
}
