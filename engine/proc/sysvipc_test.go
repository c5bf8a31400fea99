package proc

import (
	"errors"
	"testing"
)

// TestParseSysVShm: the kernel's columns, a segment marked for destruction
// (key 0, SHM_DEST in its octal mode), and a line cut short.
func TestParseSysVShm(t *testing.T) {
	b := []byte(`       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap
    109301          3   640               1048699  4242  4243      2 65534 65534     0     0 1764860000          0 1764860000               1052672                     0
         0          5  1600                 65536  4242  4242      2     0     0     0     0 1764860000          0 1764860000                 65536                     0
`)
	m, err := ParseSysVShm(b)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]SysVShm{
		3: {Key: 109301, ID: 3, Mode: 0o640, Size: 1048699, CPID: 4242, Nattch: 2, UID: 65534, GID: 65534},
		5: {Key: 0, ID: 5, Mode: 0o1600, Size: 65536, CPID: 4242, Nattch: 2},
	}
	if len(m) != 2 || m[3] != want[3] || m[5] != want[5] {
		t.Errorf("parsed %+v, want %+v", m, want)
	}
	if m[5].Mode&ShmDest == 0 {
		t.Error("SHM_DEST not seen")
	}
	if _, err := ParseSysVShm([]byte("header\n 1 2 3\n")); !errors.Is(err, ErrMalformed) {
		t.Errorf("a short line: %v, want ErrMalformed", err)
	}
}
