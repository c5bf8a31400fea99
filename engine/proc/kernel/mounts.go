package kernel

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/lazyfs/lazyfs/engine/proc"
)

// Mount is one line of /proc/PID/mountinfo: a mount of the mount
// namespace of PID.
type Mount struct {
	ID     int
	Dev    string // major:minor of the file system
	Path   string // the mount point, unescaped
	FSType string // "ext4", "fuse.lazyfs"...
	// Super are the file system's own options ("rw,cpu,cpuacct" for a
	// cgroup v1 hierarchy).
	Super string
}

// Mounts lists the mounts of the mount namespace of pid (a thread id
// too, for a thread that unshared its own), in mountinfo's order: a mount
// after the mounts it is on.
func Mounts(pid int) ([]Mount, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Mount
	s := proc.NewScanner(f)
	for s.Scan() {
		m, err := parseMountinfoLine(s.Text())
		if err != nil {
			return nil, fmt.Errorf("/proc/%d/mountinfo: %w", pid, err)
		}
		out = append(out, m)
	}
	if err := s.Err(); err != nil {
		return nil, proc.ScanErr(err)
	}
	return out, nil
}

// parseMountinfoLine parses "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 -
// ext3 /dev/root rw,errors=continue": the optional fields end at "-".
func parseMountinfoLine(line string) (Mount, error) {
	f := strings.Fields(line)
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if len(f) < 7 || sep < 0 || sep+1 >= len(f) {
		return Mount{}, fmt.Errorf("%w: mountinfo line %q", proc.ErrMalformed, line)
	}
	id, err := strconv.Atoi(f[0])
	if err != nil {
		return Mount{}, fmt.Errorf("%w: mountinfo line %q", proc.ErrMalformed, line)
	}
	m := Mount{ID: id, Dev: f[2], Path: unescapeOctal(f[4]), FSType: f[sep+1]}
	if sep+3 < len(f) {
		m.Super = f[sep+3]
	}
	return m, nil
}

// unescapeOctal undoes the kernel's \ooo escapes of a path in
// mountinfo (space, tab, newline, backslash).
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
