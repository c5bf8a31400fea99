package fs

import (
	"bytes"
	"fmt"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

// mapsNameColumn is where the kernel pads a maps line to before the name:
// seq_setwidth(m, 25 + sizeof(void *) * 6 - 1) in fs/proc/task_mmu.c.
const mapsNameColumn = 25 + 8*6 - 1

// formatMaps renders VMAs exactly as /proc/PID/maps does:
// "%08lx-%08lx %c%c%c%c %08llx %02x:%02x %lu ", then, if the VMA has a
// name, spaces up to column 72, one more space and the name.
func formatMaps(vmas []image.VMA) []byte {
	var b bytes.Buffer
	for _, v := range vmas {
		line := b.Len()
		var dev, ino uint64
		if v.File != nil {
			dev, ino = v.File.Dev, v.File.Ino
		}
		fmt.Fprintf(&b, "%08x-%08x %s %08x %02x:%02x %d ", v.Start, v.End, perms(v), v.Offset, unix.Major(dev), unix.Minor(dev), ino)
		if v.Name != "" {
			if pad := mapsNameColumn - (b.Len() - line); pad > 0 {
				b.WriteString(strings.Repeat(" ", pad))
			}
			b.WriteByte(' ')
			b.WriteString(v.Name)
		}
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// perms returns the rwxp/rwxs column of a VMA.
func perms(v image.VMA) string {
	p := []byte("---p")
	if v.Prot&unix.PROT_READ != 0 {
		p[0] = 'r'
	}
	if v.Prot&unix.PROT_WRITE != 0 {
		p[1] = 'w'
	}
	if v.Prot&unix.PROT_EXEC != 0 {
		p[2] = 'x'
	}
	if shared(v) {
		p[3] = 's'
	}
	return string(p)
}

// shared reports whether a VMA is a shared mapping (VM_MAYSHARE).
func shared(v image.VMA) bool {
	typ := v.Flags & unix.MAP_TYPE
	return typ == unix.MAP_SHARED || typ == unix.MAP_SHARED_VALIDATE || v.Kind == image.VMAShmem || v.Kind == image.VMAFileShared
}

// maxRegionName bounds the name part of a region file name (NAME_MAX is
// 255; the address part takes at most 2*16+2+5 bytes).
const maxRegionName = 200

// regionName returns the file name of a VMA under MNT/PID/regions:
// START-END-PERMS[-NAME], addresses in hex as in maps, NAME the mapping's
// name made safe for a file name: the base name of a path ("libc.so.6"),
// brackets dropped ("[heap]" -> "heap", "[anon:arena]" -> "anon_arena"),
// " (deleted)" dropped, and any byte outside [A-Za-z0-9._+-] replaced by
// '_'.
func regionName(v image.VMA) string {
	s := fmt.Sprintf("%08x-%08x-%s", v.Start, v.End, perms(v))
	if n := sanitize(v.Name); n != "" {
		s += "-" + n
	}
	return s
}

func sanitize(name string) string {
	name = strings.TrimSuffix(name, " (deleted)")
	if strings.HasPrefix(name, "/") {
		name = path.Base(name)
	}
	name = strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")
	b := []byte(name)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '+' || c == '-'
		if !ok {
			b[i] = '_'
		}
	}
	s := strings.Trim(string(b), ".")
	if len(s) > maxRegionName {
		s = s[:maxRegionName]
	}
	return s
}
