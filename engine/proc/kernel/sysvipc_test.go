package kernel

import (
	"errors"
	"testing"

	"github.com/lazyfs/lazyfs/engine/proc"
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
	if _, err := ParseSysVShm([]byte("header\n 1 2 3\n")); !errors.Is(err, proc.ErrMalformed) {
		t.Errorf("a short line: %v, want ErrMalformed", err)
	}
}

// TestParseSysVSemMsg: the kernel's columns of /proc/sysvipc/sem and
// /proc/sysvipc/msg, and lines cut short or not numbers.
func TestParseSysVSemMsg(t *testing.T) {
	sem := []byte(`       key      semid perms      nsems   uid   gid  cuid  cgid      otime      ctime
     20817          7   640          3 65534 65534     0     0 1796402100 1796402099
`)
	rows, err := parseSysVIPC("sem", sem, 10)
	if err != nil || len(rows) != 1 || rows[0][0] != 20817 || rows[0][1] != 7 || rows[0][2] != 0o640 || rows[0][3] != 3 || rows[0][8] != 1796402100 {
		t.Errorf("sem parsed %v, %v", rows, err)
	}
	msg := []byte(`       key      msqid perms      cbytes       qnum lspid lrpid   uid   gid  cuid  cgid      stime      rtime      ctime
     21074          9   600        4310          3 29656 29657     0     0     0     0 1796402099          5 1796402098
`)
	rows, err = parseSysVIPC("msg", msg, 14)
	if err != nil || len(rows) != 1 || rows[0][3] != 4310 || rows[0][4] != 3 || rows[0][5] != 29656 || rows[0][6] != 29657 || rows[0][12] != 5 {
		t.Errorf("msg parsed %v, %v", rows, err)
	}
	for _, bad := range []string{"header\n 1 2 3\n", "header\n 1 2 9 4 5 6 7 8 9 10\n", "header\n 1 x 3 4 5 6 7 8 9 10\n"} {
		if _, err := parseSysVIPC("sem", []byte(bad), 10); !errors.Is(err, proc.ErrMalformed) {
			t.Errorf("%q: %v, want ErrMalformed", bad, err)
		}
	}
}
