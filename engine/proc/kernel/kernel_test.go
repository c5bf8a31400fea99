package kernel

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/lazyfs/lazyfs/engine/proc"
)

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
		if _, err := Sysctl(name); !errors.Is(err, proc.ErrMalformed) {
			t.Errorf("Sysctl(%q): %v, want ErrMalformed", name, err)
		}
	}
	if _, err := SysctlInt("kernel.ostype"); !errors.Is(err, proc.ErrMalformed) {
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
