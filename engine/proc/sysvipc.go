package proc

import (
	"fmt"
	"strconv"
	"strings"
)

// SysVShm is one System V shared memory segment of our IPC namespace, as
// /proc/sysvipc/shm lists it.
type SysVShm struct {
	Key    int32
	ID     int
	Mode   uint32 // permission bits, with SHM_DEST (01000) and SHM_LOCKED (02000)
	Size   uint64
	CPID   int
	Nattch int
	UID    uint32
	GID    uint32
}

// ShmDest is the mode bit of a segment marked for destruction (IPC_RMID)
// that stays while attached.
const ShmDest = 0o1000

// ReadSysVShm reads /proc/sysvipc/shm, by segment id.
func ReadSysVShm() (map[int]SysVShm, error) {
	b, err := readFile("/proc/sysvipc/shm", 16<<20)
	if err != nil {
		return nil, err
	}
	return ParseSysVShm(b)
}

// ParseSysVShm parses /proc/sysvipc/shm: a header line, then per segment
// key shmid perms size cpid lpid nattch uid gid cuid cgid ...
func ParseSysVShm(b []byte) (map[int]SysVShm, error) {
	out := map[int]SysVShm{}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) < 11 {
			return nil, fmt.Errorf("%w: /proc/sysvipc/shm line %q", ErrMalformed, l)
		}
		// Columns: key shmid perms (octal) size cpid lpid nattch uid gid.
		var n [9]int64
		for i, col := range f[:9] {
			base := 10
			if i == 2 {
				base = 8
			}
			v, err := strconv.ParseInt(col, base, 64)
			if err != nil {
				return nil, fmt.Errorf("%w: /proc/sysvipc/shm line %q: %v", ErrMalformed, l, err)
			}
			n[i] = v
		}
		s := SysVShm{Key: int32(n[0]), ID: int(n[1]), Mode: uint32(n[2]), Size: uint64(n[3]), CPID: int(n[4]),
			Nattch: int(n[6]), UID: uint32(n[7]), GID: uint32(n[8])}
		out[s.ID] = s
	}
	return out, nil
}
