package fs

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

func TestFormatMapsMatchesKernel(t *testing.T) {
	vmas := []image.VMA{
		{Start: 0x55bdd1fe8000, End: 0x55bdd1fea000, Prot: protR, Flags: unix.MAP_PRIVATE, Kind: image.VMAFile,
			Name: "/usr/bin/cat", File: &image.FileID{Dev: unix.Mkdev(0xfe, 0), Ino: 247026}},
		{Start: 0x55bdd1fea000, End: 0x55bdd1fef000, Prot: protRX, Offset: 0x2000, Flags: unix.MAP_PRIVATE, Kind: image.VMAFile,
			Name: "/usr/bin/cat", File: &image.FileID{Dev: unix.Mkdev(0xfe, 0), Ino: 247026}},
		{Start: 0x55bde8277000, End: 0x55bde8298000, Prot: protRW, Flags: unix.MAP_PRIVATE, Kind: image.VMAAnon, Name: "[heap]"},
		{Start: 0x7f0dc5d99000, End: 0x7f0dc5e5d000, Prot: protRW, Flags: unix.MAP_PRIVATE, Kind: image.VMAAnon},
		{Start: 0x7f0dc60a3000, End: 0x7f0dc60aa000, Prot: protR, Flags: unix.MAP_SHARED, Kind: image.VMAFileShared,
			Name: "/usr/lib/x86_64-linux-gnu/gconv/gconv-modules.cache", File: &image.FileID{Dev: unix.Mkdev(0xfe, 0), Ino: 325737}},
		{Start: 0x400000, End: 0x401000, Prot: 0, Flags: unix.MAP_PRIVATE, Kind: image.VMAAnon},
	}
	// Lines as /proc/PID/maps prints them (kernel 6.18), trailing space
	// of an unnamed mapping included.
	want := "" +
		"55bdd1fe8000-55bdd1fea000 r--p 00000000 fe:00 247026                     /usr/bin/cat\n" +
		"55bdd1fea000-55bdd1fef000 r-xp 00002000 fe:00 247026                     /usr/bin/cat\n" +
		"55bde8277000-55bde8298000 rw-p 00000000 00:00 0                          [heap]\n" +
		"7f0dc5d99000-7f0dc5e5d000 rw-p 00000000 00:00 0 \n" +
		"7f0dc60a3000-7f0dc60aa000 r--s 00000000 fe:00 325737                     /usr/lib/x86_64-linux-gnu/gconv/gconv-modules.cache\n" +
		"00400000-00401000 ---p 00000000 00:00 0 \n"
	if got := string(formatMaps(vmas)); got != want {
		t.Errorf("maps:\n%s\nwant:\n%s", got, want)
	}
}

// TestFormatMapsOwnProcess formats this process's own maps from its
// fields and compares with the kernel's text, line by line.
func TestFormatMapsOwnProcess(t *testing.T) {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skip(err)
	}
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		v, ok := parseMapsLine(line)
		if !ok {
			t.Fatalf("cannot parse %q", line)
		}
		if got := strings.TrimSuffix(string(formatMaps([]image.VMA{v})), "\n"); got != line {
			t.Errorf("formatted\n%q\nkernel\n%q", got, line)
		}
	}
}

// parseMapsLine is a minimal parser for the test above.
func parseMapsLine(line string) (image.VMA, bool) {
	var v image.VMA
	var perm string
	var maj, min uint32
	var ino uint64
	n, err := fmt.Sscanf(line, "%x-%x %s %x %x:%x %d", &v.Start, &v.End, &perm, &v.Offset, &maj, &min, &ino)
	if err != nil || n != 7 || len(perm) != 4 {
		return v, false
	}
	prefix := fmt.Sprintf("%08x-%08x %s %08x %02x:%02x %d ", v.Start, v.End, perm, v.Offset, maj, min, ino)
	if !strings.HasPrefix(line, prefix) {
		return v, false
	}
	v.Name = strings.TrimLeft(line[len(prefix):], " ")
	for i, bit := range []int{unix.PROT_READ, unix.PROT_WRITE, unix.PROT_EXEC} {
		if perm[i] != '-' {
			v.Prot |= bit
		}
	}
	v.Flags = unix.MAP_PRIVATE
	if perm[3] == 's' {
		v.Flags = unix.MAP_SHARED
	}
	if maj != 0 || min != 0 || ino != 0 {
		v.File = &image.FileID{Dev: unix.Mkdev(maj, min), Ino: ino}
	}
	return v, true
}

func TestRegionName(t *testing.T) {
	for _, tc := range []struct {
		v    image.VMA
		want string
	}{
		{image.VMA{Start: 0x1000, End: 0x3000, Prot: protRW}, "00001000-00003000-rw-p"},
		{image.VMA{Start: 0x55bde8277000, End: 0x55bde8298000, Prot: protRW, Name: "[heap]"}, "55bde8277000-55bde8298000-rw-p-heap"},
		{image.VMA{Start: 0x7f00, End: 0x8f00, Prot: protRX, Name: "/usr/lib/x86_64-linux-gnu/libc.so.6"}, "00007f00-00008f00-r-xp-libc.so.6"},
		{image.VMA{Start: 0x1000, End: 0x2000, Prot: protRW, Name: "[anon:weights arena]"}, "00001000-00002000-rw-p-anon_weights_arena"},
		{image.VMA{Start: 0x1000, End: 0x2000, Prot: protRW, Flags: unix.MAP_SHARED, Kind: image.VMAShmem, Name: "/memfd:cache (deleted)"}, "00001000-00002000-rw-s-memfd_cache"},
		{image.VMA{Start: 0x1000, End: 0x2000, Prot: protRW, Name: "/SYSV00000000 (deleted)"}, "00001000-00002000-rw-p-SYSV00000000"},
		{image.VMA{Start: 0x1000, End: 0x2000, Prot: protRW, Name: "/a/b/.."}, "00001000-00002000-rw-p"},
		{image.VMA{Start: 0x1000, End: 0x2000, Prot: protR, Name: "[vdso]"}, "00001000-00002000-r--p-vdso"},
		{image.VMA{Start: 0x1000, End: 0x2000, Prot: protR, Name: "/x/" + strings.Repeat("n", 300)}, "00001000-00002000-r--p-" + strings.Repeat("n", maxRegionName)},
		{image.VMA{Start: 0x1000, End: 0x2000, Prot: protR, Name: "/tmp/évil\nname/../x y"}, "00001000-00002000-r--p-x_y"},
	} {
		if got := regionName(tc.v); got != tc.want {
			t.Errorf("regionName(%q) = %q, want %q", tc.v.Name, got, tc.want)
		}
	}
}
