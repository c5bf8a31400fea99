package testutil

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// CommandTimeout bounds every command Output runs.
const CommandTimeout = 2 * time.Minute

// Output runs a command (one of the tools people use on memory images:
// cmp, dd, xxd, strings...) under CommandTimeout and returns its standard
// output. The command must exist (RequireCommand); its failure fails the
// test with its standard error.
func Output(t testing.TB, name string, args ...string) []byte {
	t.Helper()
	RequireCommand(t, name)
	ctx, cancel := context.WithTimeout(context.Background(), CommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// WriteTemp writes b to a new file in the test's temporary directory and
// returns its path (for comparing with cmp, say).
func WriteTemp(t testing.TB, b []byte) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "want-")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}
