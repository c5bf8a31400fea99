package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/lazyfs/lazyfs/engine"
	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/fds/sock"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/store/s3"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/fs"
)

// TestExitCode maps errors wrapped as the commands return them (a step
// name, a path, a BlockError...) to their statuses. The numbers are
// spelled out: they are the contract.
func TestExitCode(t *testing.T) {
	step := func(name string, err error) error { return &engine.StepError{Step: name, Err: err} }
	block := func(err error) error {
		return step("fill memory", &image.BlockError{File: "pages-7.img", Block: 3, Addr: 0x7f0000000000, Err: err})
	}
	for _, tc := range []struct {
		name string
		err  error
		code int
	}{
		{"nil", nil, 0},
		{"help", ErrHelp, 0},
		{"other", errors.New("boom"), 1},
		{"context canceled, no signal", fmt.Errorf("lazy memory: %w", context.Canceled), 1},
		{"snapshot exists", fmt.Errorf("create /x: %w", image.ErrExists), 1},
		{"missing directory", step("open snapshot", &os.PathError{Op: "stat", Path: "/x", Err: syscall.ENOENT}), 1},
		{"mountpoint busy", fmt.Errorf("mount /m: %w: %w", fs.ErrBusy, syscall.EBUSY), 1},
		{"block read failed", block(syscall.EIO), 1},
		{"usage", Usagef("-D DIR is required"), 2},
		{"usage wrapped", fmt.Errorf("x: %w", &UsageError{"bad"}), 2},
		{"unsupported", step("dump descriptors", fmt.Errorf("fd 5: %w: inotify file descriptors cannot be dumped yet", engine.ErrUnsupported)), 3},
		{"zombie child", step("freeze", fmt.Errorf("pid 6 (sh), child of 5: %w: a zombie", engine.ErrUnsupported)), 3},
		{"already traced", step("freeze", &ptrace.AlreadyTracedError{Pid: 5, TracerPid: 6}), 3},
		{"no such process", step("check", fmt.Errorf("pid 5: %w", ptrace.ErrNoProcess)), 4},
		{"pid in use", step("check", fmt.Errorf("%w: pid 5 is taken by \"sleep\"", engine.ErrPIDInUse)), 5},
		{"tid in use", step("create process", fmt.Errorf("%w: pid 5 was taken meanwhile", engine.ErrPIDInUse)), 5},
		{"other kernel", step("check", fmt.Errorf("%w: dumped on 6.1 x86_64", engine.ErrKernelMismatch)), 6},
		{"incomplete", step("open snapshot", fmt.Errorf("/x: %w", image.ErrIncomplete)), 7},
		{"corrupt", fmt.Errorf("%w: manifest: unexpected end of JSON input", image.ErrCorrupt), 7},
		{"bad magic", fmt.Errorf("pagemap-5.img: %w", image.ErrBadMagic), 7},
		{"header checksum", fmt.Errorf("pagemap-5.img: %w", image.ErrHeaderChecksum), 7},
		{"truncated", fmt.Errorf("pagemap-5.img: %w", image.ErrTruncated), 7},
		{"manifest mismatch", fmt.Errorf("pages-5.img: %w: 10 bytes", image.ErrManifestMismatch), 7},
		{"format version", fmt.Errorf("%w: manifest version 2", image.ErrVersion), 7},
		{"untrusted snapshot", fmt.Errorf("%w: /x is writable by others", image.ErrUntrusted), 8},
		{"unsafe dump directory", step("create snapshot", fmt.Errorf("%w: /x belongs to uid 1000", image.ErrUnsafeDir)), 8},
		{"untrusted socket path", step("file descriptors", fmt.Errorf("fd 3: %w", sock.ErrUntrustedPath)), 8},
		{"dump directory locked", fmt.Errorf("/x: %w", image.ErrLocked), 11},
		{"cleanup of a live lock", fmt.Errorf("s3://b/p: %w", s3.ErrLockHeld), 11},
		{"block checksum", block(fmt.Errorf("%w: crc32c 1, want 2", codec.ErrChecksum)), 7},
		{"block undecodable", block(fmt.Errorf("%w: lz4", codec.ErrUndecodable)), 7},
		{"codec error alone", fmt.Errorf("verify: %w", &codec.BlockError{Index: 1, Err: codec.ErrChecksum}), 7},
		{"file changed", step("check", fmt.Errorf("%w: /lib/x.so is now another file", engine.ErrFileChanged)), 9},
		{"EPERM", step("start tracer", fmt.Errorf("seize 5: %w", syscall.EPERM)), 10},
		{"EACCES", &os.PathError{Op: "open", Path: "/x", Err: syscall.EACCES}, 10},
		{"ENOSYS", fmt.Errorf("userfaultfd: %w", syscall.ENOSYS), 10},
		{"no FUSE", fmt.Errorf("mount /m: %w: %w", fs.ErrNoFUSE, syscall.ENODEV), 10},
		{"kernel lacks", fmt.Errorf("pagemap: PAGEMAP_SCAN: %w", errors.ErrUnsupported), 10},
		{"chosen", WithExit(ExitNoPrivilege, errors.New("check: missing FUSE")), 10},
		// The more specific sentinel wins over an errno behind it.
		{"pid in use over EEXIST", fmt.Errorf("%w: clone3: %w", engine.ErrPIDInUse, syscall.EEXIST), 5},
		{"unsupported over EPERM", fmt.Errorf("%w: %w", engine.ErrUnsupported, syscall.EPERM), 3},
	} {
		if got := ExitCode(tc.err); got != tc.code {
			t.Errorf("%s: ExitCode(%v) = %d, want %d", tc.name, tc.err, got, tc.code)
		}
	}
}

func TestReport(t *testing.T) {
	var b []byte
	w := writerFunc(func(p []byte) { b = append(b, p...) })
	if code := Report(w, "snapctl", nil, false); code != 0 || len(b) > 0 {
		t.Errorf("nil: %d %q", code, b)
	}
	if code := Report(w, "snapctl", ErrHelp, false); code != 0 || len(b) > 0 {
		t.Errorf("help: %d %q", code, b)
	}
	err := fmt.Errorf("%w: pid 5", engine.ErrPIDInUse)
	if code := Report(w, "snapctl", err, false); code != 5 || string(b) != "snapctl: pid in use: pid 5\n" {
		t.Errorf("pid in use: %d %q", code, b)
	}
	b = nil
	if code := Report(w, "snapctl", err, true); code != 130 || len(b) == 0 {
		t.Errorf("interrupted: %d %q", code, b)
	}
	// EPERM as a user: what to do, on the same line; as root, nothing
	// more (the privilege missing is another: the message names it).
	eperm := fmt.Errorf("seize 1: PTRACE_SEIZE 1: %w", syscall.EPERM)
	for _, euid := range []int{1000, 0} {
		geteuid = func() int { return euid }
		b = nil
		code := Report(w, "snapctl", eperm, false)
		hint := strings.Contains(string(b), "run it as root")
		if code != ExitNoPrivilege || hint != (euid != 0) || strings.Count(string(b), "\n") != 1 {
			t.Errorf("EPERM as uid %d: %d %q", euid, code, b)
		}
	}
	geteuid = os.Geteuid
}

type writerFunc func([]byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }

// TestStatusesDocumented: the exit status tables of the manual
// (docs/cli.md, Exit status) and of README.md's summary (Exit status) list
// every status with its code, and no other.
func TestStatusesDocumented(t *testing.T) {
	var want []int
	for _, s := range Statuses {
		want = append(want, s.Code)
	}
	root := filepath.Join("..", "..", "..")
	for _, doc := range []struct{ file, heading string }{
		{filepath.Join("docs", "cli.md"), "## Exit status"},
		{"README.md", "## Exit status"},
	} {
		b, err := os.ReadFile(filepath.Join(root, doc.file))
		if err != nil {
			t.Fatal(err)
		}
		section, ok := docSection(string(b), doc.heading)
		if !ok {
			t.Errorf("%s has no section %q", doc.file, doc.heading)
			continue
		}
		rows := regexp.MustCompile("(?m)^\\| `?(\\d+)`? \\|").FindAllStringSubmatch(section, -1)
		var got []int
		for _, r := range rows {
			n, _ := strconv.Atoi(r[1])
			got = append(got, n)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s exit status rows %v, want %v", doc.file, got, want)
		}
	}
	for i := 1; i < len(Statuses); i++ {
		if Statuses[i].Code <= Statuses[i-1].Code {
			t.Errorf("Statuses out of order at %d", Statuses[i].Code)
		}
	}
}

// docSection returns the lines of a Markdown document from the heading
// line that is exactly heading to the next heading of the same level or
// above (outside code blocks), and whether the heading was found once.
func docSection(doc, heading string) (string, bool) {
	level := len(heading) - len(strings.TrimLeft(heading, "#"))
	var out []string
	found, in, code := 0, false, false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			code = !code
		}
		if !code && strings.HasPrefix(line, "#") {
			n := len(line) - len(strings.TrimLeft(line, "#"))
			if line == heading {
				found++
				in = true
			} else if n <= level && strings.HasPrefix(line[n:], " ") {
				in = false
			}
		}
		if in {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n"), found == 1
}
