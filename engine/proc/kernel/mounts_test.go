package kernel

import (
	"errors"
	"os"
	"testing"

	"github.com/lazyfs/lazyfs/engine/proc"
)

func TestParseMountinfoLine(t *testing.T) {
	for line, want := range map[string]Mount{
		`36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`:          {ID: 36, Dev: "98:0", Path: "/mnt2", FSType: "ext3", Super: "rw,errors=continue"},
		`77 25 0:52 / /tmp/my\040snap rw,nosuid,nodev - fuse.lazyfs snap rw,user_id=0,group_id=0`: {ID: 77, Dev: "0:52", Path: "/tmp/my snap", FSType: "fuse.lazyfs", Super: "rw,user_id=0,group_id=0"},
		`22 1 0:21 / /proc rw shared:5 shared:6 - proc proc rw`:                                   {ID: 22, Dev: "0:21", Path: "/proc", FSType: "proc", Super: "rw"},
		`23 1 0:22 / /a\134b rw - tmpfs x rw`:                                                     {ID: 23, Dev: "0:22", Path: `/a\b`, FSType: "tmpfs", Super: "rw"},
	} {
		got, err := parseMountinfoLine(line)
		if err != nil || got != want {
			t.Errorf("%q: %+v, %v; want %+v", line, got, err, want)
		}
	}
	for _, bad := range []string{"", "1 2 3", "x 1 0:1 / /a rw - ext4 s rw", "1 1 0:1 / /a rw ext4 s rw", "1 1 0:1 / /a rw -"} {
		if _, err := parseMountinfoLine(bad); !errors.Is(err, proc.ErrMalformed) {
			t.Errorf("%q: %v, want proc.ErrMalformed", bad, err)
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
