package proc

import (
	"errors"
	"os"
	"testing"
)

func TestParseMountinfoLine(t *testing.T) {
	for line, want := range map[string]Mount{
		`36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`:          {36, "98:0", "/mnt2", "ext3"},
		`77 25 0:52 / /tmp/my\040snap rw,nosuid,nodev - fuse.lazyfs snap rw,user_id=0,group_id=0`: {77, "0:52", "/tmp/my snap", "fuse.lazyfs"},
		`22 1 0:21 / /proc rw shared:5 shared:6 - proc proc rw`:                                   {22, "0:21", "/proc", "proc"},
		`23 1 0:22 / /a\134b rw - tmpfs x rw`:                                                     {23, "0:22", `/a\b`, "tmpfs"},
	} {
		got, err := parseMountinfoLine(line)
		if err != nil || got != want {
			t.Errorf("%q: %+v, %v; want %+v", line, got, err, want)
		}
	}
	for _, bad := range []string{"", "1 2 3", "x 1 0:1 / /a rw - ext4 s rw", "1 1 0:1 / /a rw ext4 s rw", "1 1 0:1 / /a rw -"} {
		if _, err := parseMountinfoLine(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("%q: %v, want ErrMalformed", bad, err)
		}
	}
}

func TestMountsSelf(t *testing.T) {
	ms, err := Mounts(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	root := false
	for _, m := range ms {
		root = root || m.Path == "/"
	}
	if !root {
		t.Errorf("no mount on / among %d", len(ms))
	}
}
