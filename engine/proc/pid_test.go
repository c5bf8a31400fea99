package proc

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

func TestExists(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	pidMax, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if pidMax < 300 {
		t.Fatalf("kernel.pid_max %d", pidMax)
	}
	for _, tc := range []struct {
		id   int
		want bool
	}{{os.Getpid(), true}, {0, false}, {-1, false}, {pidMax, false}} {
		if got, err := Exists(tc.id); got != tc.want || err != nil {
			t.Errorf("Exists(%d) = %v, %v; want %v", tc.id, got, err, tc.want)
		}
	}
	// A thread id is not listed in /proc but resolves there.
	tids, err := Tasks(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, tid := range tids {
		if ok, err := Exists(tid); !ok || err != nil {
			t.Errorf("Exists(thread %d) = %v, %v", tid, ok, err)
		}
	}
	// A child that exited and was reaped no longer exists.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if ok, err := Exists(cmd.Process.Pid); ok || err != nil {
		t.Errorf("Exists(reaped %d) = %v, %v", cmd.Process.Pid, ok, err)
	}
}
