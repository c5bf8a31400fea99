package task

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPIDHeldBySession: a session leader's pid stays taken after the
// leader is reaped while a process of its session lives (a restore must
// say who holds it), and becomes free once that process is gone too (a
// restore waits for its zombie to be reaped instead of failing).
func TestPIDHeldBySession(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	// The leader execs sleep; its background child keeps the session.
	cmd := exec.Command(sh, "-c", `sleep 60 & echo $!; exec sleep 60`)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	leader := cmd.Process.Pid
	var buf [32]byte
	n, err := out.Read(buf[:])
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal(err)
	}
	child, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child pid %q: %v", buf[:n], err)
	}
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
	cmd.Process.Kill()
	cmd.Wait()

	if busy, _ := PIDInUse(leader); busy {
		t.Fatalf("pid %d: no task should have it once reaped", leader)
	}
	err = AwaitPIDReleased(leader)
	if !errors.Is(err, ErrPIDInUse) || !strings.Contains(err.Error(), "process group and session id of pid "+strconv.Itoa(child)+" (sleep), which runs") {
		t.Fatalf("pid %d held as the session of live pid %d: %v", leader, child, err)
	}

	syscall.Kill(child, syscall.SIGKILL)
	start := time.Now()
	if err := AwaitPIDReleased(leader); err != nil {
		t.Fatalf("after its session's last process was killed: %v", err)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(child)); err == nil {
		t.Errorf("pid %d called free while %d is still listed", leader, child)
	}
	t.Logf("pid %d free %v after its session's last process was killed", leader, time.Since(start))
}
