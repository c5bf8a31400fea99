package syscalls

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// TestOpenAt2All opens many files in a traced process through a small
// scratch area (several chunks): each descriptor is the file asked for,
// its fstat is that file's, a missing file and a symbolic link (refused
// by RESOLVE_NO_SYMLINKS) fail alone, and it takes far fewer resumes than
// two per file.
func TestOpenAt2All(t *testing.T) {
	_, _, p := startSeized(t, "sleeper", ptrace.SeizeOptions{})
	in, err := New(p.Leader(), pageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	dir := t.TempDir()
	var reqs []OpenReq
	for i := range 40 {
		path := fmt.Sprintf("%s/file-%02d-%s", dir, i, strings.Repeat("x", i))
		if err := os.WriteFile(path, make([]byte, i*100), 0o644); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, OpenReq{Path: path, Flags: unix.O_RDONLY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
	}
	if err := os.Symlink(reqs[0].Path, dir+"/link"); err != nil {
		t.Fatal(err)
	}
	missing, link := len(reqs), len(reqs)+1
	reqs = append(reqs,
		OpenReq{Path: dir + "/missing", Flags: unix.O_RDONLY, Resolve: unix.RESOLVE_NO_SYMLINKS},
		OpenReq{Path: dir + "/link", Flags: unix.O_RDONLY, Resolve: unix.RESOLVE_NO_SYMLINKS})
	if fds, _, _, err := in.OpenAt2All(nil); err != nil || len(fds) != 0 {
		t.Fatalf("no files: %v, %v", fds, err)
	}
	r0 := ptrace.Resumes()
	fds, sts, errs, err := in.OpenAt2All(reqs)
	if err != nil {
		t.Fatal(err)
	}
	if n := ptrace.Resumes() - r0; n > int64(len(reqs)/4) {
		t.Errorf("%d files took %d resumes", len(reqs), n)
	}
	for i, r := range reqs {
		switch i {
		case missing, link:
			want := map[int]unix.Errno{missing: unix.ENOENT, link: unix.ELOOP}[i]
			if fds[i] != -1 || !errors.Is(errs[i], want) {
				t.Errorf("%s: fd %d, error %v; want -1 and %v", r.Path, fds[i], errs[i], want)
			}
			continue
		}
		if errs[i] != nil {
			t.Fatalf("%s: %v", r.Path, errs[i])
		}
		got, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", p.Pid(), fds[i]))
		if err != nil || got != r.Path {
			t.Errorf("fd %d of %s is %q (%v)", fds[i], r.Path, got, err)
		}
		var st unix.Stat_t
		if err := unix.Stat(r.Path, &st); err != nil {
			t.Fatal(err)
		}
		if sts[i].Ino != st.Ino || sts[i].Size != st.Size {
			t.Errorf("%s: fstat says inode %d size %d, stat inode %d size %d", r.Path, sts[i].Ino, sts[i].Size, st.Ino, st.Size)
		}
		if err := in.CloseFD(fds[i]); err != nil {
			t.Fatal(err)
		}
	}
}
