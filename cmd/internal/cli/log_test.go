package cli

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLogFlags: --log-file appends records there, --log-format json
// writes an object a line, -v lets debug records through; a format of
// neither kind is a usage error.
func TestLogFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "log")
	os.WriteFile(file, []byte("before\n"), 0o600)
	fs := Command{Name: "t"}.Flags(io.Discard, io.Discard)
	lf := NewLogFlags(fs)
	if err := fs.Parse([]string{"-v", "--log-file", file, "--log-format", "json"}); err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	log, closeLog, err := lf.Logger(&stderr)
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("a step", "pid", 42)
	closeLog()
	b, _ := os.ReadFile(file)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var rec map[string]any
	if len(lines) != 2 || lines[0] != "before" || json.Unmarshal([]byte(lines[1]), &rec) != nil || rec["msg"] != "a step" || rec["pid"] != 42.0 {
		t.Errorf("log file:\n%s", b)
	}
	if stderr.Len() != 0 {
		t.Errorf("records on stderr with --log-file: %q", stderr.String())
	}

	fs = Command{Name: "t"}.Flags(io.Discard, io.Discard)
	lf = NewLogFlags(fs)
	if err := fs.Parse([]string{"--log-format", "xml"}); err != nil {
		t.Fatal(err)
	}
	var ue *UsageError
	if _, _, err := lf.Logger(io.Discard); !errors.As(err, &ue) {
		t.Errorf("--log-format xml: %v, want a usage error", err)
	}
}
