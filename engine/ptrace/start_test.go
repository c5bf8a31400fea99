package ptrace

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/test/fixture"
)

// ourChildren lists the children of every thread of the test process.
func ourChildren(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		out = append(out, strings.Fields(string(b))...)
	}
	slices.Sort(out)
	return out
}

// TestStartStoppedFails: a start that fails after the fork (here the
// seize, given options the kernel refuses) kills and reaps the child and
// keeps no process.
func TestStartStoppedFails(t *testing.T) {
	tr := newTracer(t)
	bin := fixture.Build(t, "sleeper")
	before := ourChildren(t)
	_, err := tr.StartStopped(bin, []string{"stub"}, StartOptions{Options: 1 << 30})
	if err == nil || !strings.Contains(err.Error(), "PTRACE_SEIZE") {
		t.Fatalf("StartStopped with unknown options: %v, want a PTRACE_SEIZE error", err)
	}
	if ps := tr.Processes(); len(ps) != 0 {
		t.Errorf("the tracer keeps %d processes", len(ps))
	}
	if after := ourChildren(t); !slices.Equal(before, after) {
		t.Errorf("children %v after the failed start, %v before", after, before)
	}
	if _, err := tr.StartStopped(filepath.Join(t.TempDir(), "missing"), []string{"x"}, StartOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("StartStopped of a missing program: %v, want ENOENT", err)
	}
}
