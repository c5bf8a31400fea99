package image

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// nobody is a uid that is neither root nor the test's.
const nobody = 65534

func TestCreateDirectoryChecks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a directory to another user")
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  error
	}{
		{"world-writable", func(t *testing.T, dir string) { mustDo(t, os.Mkdir(dir, 0o777), os.Chmod(dir, 0o777)) }, ErrUnsafeDir},
		{"group-writable", func(t *testing.T, dir string) { mustDo(t, os.Mkdir(dir, 0o770), os.Chmod(dir, 0o770)) }, ErrUnsafeDir},
		{"another owner", func(t *testing.T, dir string) { mustDo(t, os.Mkdir(dir, 0o700), os.Chown(dir, nobody, nobody)) }, ErrUnsafeDir},
		{"symbolic link", func(t *testing.T, dir string) {
			target := filepath.Join(filepath.Dir(dir), "elsewhere")
			mustDo(t, os.Mkdir(target, 0o700), os.Symlink(target, dir))
		}, ErrUnsafeDir},
		{"planted files", func(t *testing.T, dir string) {
			// A user who could write the directory planted links to root
			// files under the names the dump will write.
			mustDo(t, os.Mkdir(dir, 0o700), os.Symlink("/etc/passwd", filepath.Join(dir, stateName(3))),
				os.Symlink("/etc/shadow", filepath.Join(dir, "."+ManifestName+".tmp")))
		}, ErrNotEmpty},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "snap")
			tc.setup(t, dir)
			w, err := Create(dir, Options{})
			if !errors.Is(err, tc.want) {
				if w != nil {
					w.Abort()
				}
				t.Fatalf("Create: %v, want %v", err, tc.want)
			}
		})
	}
}

func mustDo(t *testing.T, errs ...error) {
	t.Helper()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestCreateMakesPrivateDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "snap")
	old := unix.Umask(0)
	defer unix.Umask(old)
	writeSnapshot(t, dir, 3, layoutRanges(5)[:1], Options{})
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("snapshot directory mode %v, want 0700", fi.Mode().Perm())
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if fi, _ := e.Info(); fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s mode %v: readable by others", e.Name(), fi.Mode().Perm())
		}
	}
}

// TestCreateNotEmpty: a directory that is not empty is refused, saying
// what it holds and what to do: a snapshot, the files of a dump that did
// not finish, or files no dump wrote (a web root).
func TestCreateNotEmpty(t *testing.T) {
	for _, tc := range []struct {
		files []string
		want  error
		says  []string
	}{
		{[]string{"pages-3.img", ManifestName, "process-3.json"}, ErrExists, []string{ManifestName, "remove it"}},
		{[]string{"pagemap-3.img", "pages-3.img"}, ErrNotEmpty, []string{"a dump that did not finish", "pagemap-3.img", "rm -r"}},
		{[]string{"index.html", "style.css"}, ErrNotEmpty, []string{"index.html and 1 more", "which no dump wrote", "new or empty directory"}},
	} {
		dir := filepath.Join(t.TempDir(), "snap")
		mustDo(t, os.Mkdir(dir, 0o700))
		for _, f := range tc.files {
			mustDo(t, os.WriteFile(filepath.Join(dir, f), nil, 0o600))
		}
		w, err := Create(dir, Options{})
		if !errors.Is(err, tc.want) {
			if w != nil {
				w.Abort()
			}
			t.Fatalf("Create over %v: %v, want %v", tc.files, err, tc.want)
		}
		for _, s := range tc.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("Create over %v: %q does not say %q", tc.files, err, s)
			}
		}
	}
}

// TestAbortRemovesDirectory: a dump that fails leaves no directory it
// made, and leaves one it was given.
func TestAbortRemovesDirectory(t *testing.T) {
	made := filepath.Join(t.TempDir(), "a", "snap")
	w, err := Create(made, Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.Abort()
	if _, err := os.Stat(made); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an aborted dump left the directory it made: %v", err)
	}
	given := filepath.Join(t.TempDir(), "snap")
	mustDo(t, os.Mkdir(given, 0o700))
	if w, err = Create(given, Options{}); err != nil {
		t.Fatal(err)
	}
	w.Abort()
	if _, err := os.Stat(given); err != nil {
		t.Errorf("an aborted dump removed the directory it was given: %v", err)
	}
}

// TestCreateLocked: a second dump into a directory that one is writing
// is refused, and the first one's snapshot is the one committed.
func TestCreateLocked(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	w, err := Create(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	if w2, err := Create(dir, Options{}); !errors.Is(err, ErrLocked) {
		if w2 != nil {
			w2.Abort()
		}
		t.Fatalf("second Create: %v, want ErrLocked", err)
	}
	w.Abort()
	// Unlocked by Abort, and empty again: a new dump may start.
	w3, err := Create(dir, Options{})
	if err != nil {
		t.Fatalf("Create after Abort: %v", err)
	}
	w3.Abort()
}

// TestCommitNeverReplaces: a manifest that appears during a dump (placed
// by hand: two dumps cannot run at once) is not replaced by Commit.
func TestCommitNeverReplaces(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	w, err := Create(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	if err := w.WriteState(&Process{PID: 3, Threads: []Thread{{TID: 3}}}); err != nil {
		t.Fatal(err)
	}
	delete(w.m.Files, stateName(3)) // commit checks nothing but the manifest here
	w.m.Processes = nil
	if err := os.WriteFile(filepath.Join(dir, ManifestName), []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); !errors.Is(err, ErrExists) {
		t.Fatalf("Commit over a manifest: %v, want ErrExists", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, ManifestName)); string(b) != "{}\n" {
		t.Errorf("the manifest was replaced: %q", b)
	}
}

// TestOpenRefusesUntrusted: a snapshot that another user could have
// changed (its directory or a file owned by them, or writable by group or
// others) is refused unless the caller says to trust it; a file replaced
// by a link is refused even then.
func TestOpenRefusesUntrusted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files to another user")
	}
	for _, tc := range []struct {
		name string
		mod  func(t *testing.T, dir string)
		want error // without Trust; with Trust, nil
	}{
		{"directory of another user", func(t *testing.T, dir string) { mustDo(t, os.Chown(dir, nobody, nobody)) }, ErrUntrusted},
		{"directory writable by all", func(t *testing.T, dir string) { mustDo(t, os.Chmod(dir, 0o777)) }, ErrUntrusted},
		{"pages of another user", func(t *testing.T, dir string) { mustDo(t, os.Chown(filepath.Join(dir, pagesName(3)), nobody, nobody)) }, ErrUntrusted},
		{"state writable by group", func(t *testing.T, dir string) { mustDo(t, os.Chmod(filepath.Join(dir, stateName(3)), 0o660)) }, ErrUntrusted},
		{"manifest writable by others", func(t *testing.T, dir string) { mustDo(t, os.Chmod(filepath.Join(dir, ManifestName), 0o602)) }, ErrUntrusted},
		{"root's, read by all", func(t *testing.T, dir string) {
			mustDo(t, os.Chmod(dir, 0o755), os.Chmod(filepath.Join(dir, pagesName(3)), 0o644))
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "snap")
			writeSnapshot(t, dir, 3, layoutRanges(5)[:1], Options{})
			tc.mod(t, dir)
			s, err := Open(dir)
			if err == nil {
				s.Close()
			}
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Open: %v, want %v", err, tc.want)
			}
			s, err = OpenWith(dir, OpenOptions{Trust: true})
			if err != nil {
				t.Fatalf("OpenWith Trust: %v", err)
			}
			s.Close()
		})
	}
	t.Run("file replaced by a link", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "snap")
		writeSnapshot(t, dir, 3, layoutRanges(5)[:1], Options{})
		p := filepath.Join(dir, stateName(3))
		moved := filepath.Join(filepath.Dir(dir), "moved.json")
		mustDo(t, os.Rename(p, moved), os.Symlink(moved, p))
		if s, err := OpenWith(dir, OpenOptions{Trust: true}); err == nil {
			s.Close()
			t.Fatal("opened a snapshot whose state file is a link")
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Open: %v, want ErrCorrupt", err)
		}
	})
}
