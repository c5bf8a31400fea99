package kernel

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/lazyfs/lazyfs/engine/proc"
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
	b, err := proc.ReadFile("/proc/sysvipc/shm", proc.MaxSmallFile)
	if err != nil {
		return nil, err
	}
	return ParseSysVShm(b)
}

// ParseSysVShm parses /proc/sysvipc/shm: a header line, then per segment
// key shmid perms size cpid lpid nattch uid gid cuid cgid ...
func ParseSysVShm(b []byte) (map[int]SysVShm, error) {
	rows, err := parseSysVIPC("shm", b, 11)
	if err != nil {
		return nil, err
	}
	out := map[int]SysVShm{}
	for _, n := range rows {
		s := SysVShm{Key: int32(n[0]), ID: int(n[1]), Mode: uint32(n[2]), Size: uint64(n[3]), CPID: int(n[4]),
			Nattch: int(n[6]), UID: uint32(n[7]), GID: uint32(n[8])}
		out[s.ID] = s
	}
	return out, nil
}

// SysVSem is one System V semaphore set of our IPC namespace, as
// /proc/sysvipc/sem lists it.
type SysVSem struct {
	Key          int32
	ID           int
	Mode         uint32 // permission bits
	NSems        int
	UID, GID     uint32
	OTime, CTime int64 // last semop, last change (seconds)
}

// SysVMsg is one System V message queue of our IPC namespace, as
// /proc/sysvipc/msg lists it.
type SysVMsg struct {
	Key                 int32
	ID                  int
	Mode                uint32 // permission bits
	CBytes              uint64 // bytes queued
	QNum                int    // messages queued
	LSPID, LRPID        int    // last msgsnd, last msgrcv
	UID, GID            uint32
	STime, RTime, CTime int64 // last msgsnd, msgrcv, change (seconds)
}

// ReadSysVSem reads /proc/sysvipc/sem.
func ReadSysVSem() ([]SysVSem, error) {
	rows, err := readSysVIPC("sem", 10)
	if err != nil {
		return nil, err
	}
	// key semid perms nsems uid gid cuid cgid otime ctime
	out := make([]SysVSem, 0, len(rows))
	for _, n := range rows {
		out = append(out, SysVSem{Key: int32(n[0]), ID: int(n[1]), Mode: uint32(n[2]), NSems: int(n[3]),
			UID: uint32(n[4]), GID: uint32(n[5]), OTime: n[8], CTime: n[9]})
	}
	return out, nil
}

// ReadSysVMsg reads /proc/sysvipc/msg.
func ReadSysVMsg() ([]SysVMsg, error) {
	rows, err := readSysVIPC("msg", 14)
	if err != nil {
		return nil, err
	}
	// key msqid perms cbytes qnum lspid lrpid uid gid cuid cgid stime rtime ctime
	out := make([]SysVMsg, 0, len(rows))
	for _, n := range rows {
		out = append(out, SysVMsg{Key: int32(n[0]), ID: int(n[1]), Mode: uint32(n[2]), CBytes: uint64(n[3]), QNum: int(n[4]),
			LSPID: int(n[5]), LRPID: int(n[6]), UID: uint32(n[7]), GID: uint32(n[8]), STime: n[11], RTime: n[12], CTime: n[13]})
	}
	return out, nil
}

// readSysVIPC reads /proc/sysvipc/NAME: a header line, then per object at
// least cols numbers, the third (perms) octal.
func readSysVIPC(name string, cols int) ([][]int64, error) {
	b, err := proc.ReadFile("/proc/sysvipc/"+name, proc.MaxSmallFile)
	if err != nil {
		return nil, err
	}
	return parseSysVIPC(name, b, cols)
}

func parseSysVIPC(name string, b []byte, cols int) ([][]int64, error) {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var out [][]int64
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) < cols {
			return nil, fmt.Errorf("%w: /proc/sysvipc/%s line %q", proc.ErrMalformed, name, l)
		}
		n := make([]int64, cols)
		for i, col := range f[:cols] {
			base := 10
			if i == 2 {
				base = 8
			}
			v, err := strconv.ParseInt(col, base, 64)
			if err != nil {
				return nil, fmt.Errorf("%w: /proc/sysvipc/%s line %q: %v", proc.ErrMalformed, name, l, err)
			}
			n[i] = v
		}
		out = append(out, n)
	}
	return out, nil
}
