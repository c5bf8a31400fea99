package proc

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestExists(t *testing.T) {
	pidMax, err := SysctlInt("kernel.pid_max")
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

func TestSysctl(t *testing.T) {
	if v, err := Sysctl("kernel.ostype"); err != nil || v != "Linux" {
		t.Errorf("kernel.ostype = %q, %v", v, err)
	}
	if v, err := Sysctl("kernel/ostype"); err != nil || v != "Linux" {
		t.Errorf("kernel/ostype = %q, %v", v, err)
	}
	if _, err := Sysctl("kernel.no_such_parameter"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing parameter: %v", err)
	}
	for _, name := range []string{"", "/etc/passwd", "kernel//x", "../../etc/passwd", "kernel/../../x"} {
		if _, err := Sysctl(name); !errors.Is(err, ErrMalformed) {
			t.Errorf("Sysctl(%q): %v, want ErrMalformed", name, err)
		}
	}
	if _, err := SysctlInt("kernel.ostype"); !errors.Is(err, ErrMalformed) {
		t.Errorf("SysctlInt of a word: %v", err)
	}
}

func TestSysChoice(t *testing.T) {
	dir := t.TempDir()
	for in, want := range map[string]string{
		"always [madvise] never\n":         "madvise",
		"[always] inherit madvise never\n": "always",
		"always madvise [never]":           "never",
		"always madvise never\n":           "",
	} {
		path := filepath.Join(dir, "enabled")
		if err := os.WriteFile(path, []byte(in), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := sysChoice(path)
		if got != want || (err != nil) != (want == "") {
			t.Errorf("sysChoice(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
