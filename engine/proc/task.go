package proc

import (
	"bytes"
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Bounds on lists read from /proc.
const (
	maxTasks   = 1 << 22 // pid_max limit
	maxCmdline = 2 << 20 // the kernel shows at most the arg area
	maxArgs    = 1 << 20
)

// ReadComm reads /proc/PID/comm without the trailing newline.
func ReadComm(pid int) (string, error) {
	return readComm(pidPath(pid, "comm"))
}

// ReadTaskComm reads /proc/PID/task/TID/comm: each thread has its own.
func ReadTaskComm(pid, tid int) (string, error) {
	return readComm(taskPath(pid, tid, "comm"))
}

func readComm(path string) (string, error) {
	b, err := ReadFile(path, 64)
	if err != nil {
		return "", fmt.Errorf("read comm: %w", err)
	}
	return string(bytes.TrimSuffix(b, []byte{'\n'})), nil
}

// ParseCmdline splits /proc/PID/cmdline at NUL bytes. A final NUL ends the
// last argument; text after the last NUL (a process that overwrote its
// arguments) is kept as a last argument.
func ParseCmdline(b []byte) ([]string, error) {
	if len(b) > maxCmdline {
		return nil, fmt.Errorf("%w: cmdline longer than %d bytes", ErrTooLarge, maxCmdline)
	}
	b = bytes.TrimSuffix(b, []byte{0})
	if len(b) == 0 {
		return nil, nil
	}
	n := bytes.Count(b, []byte{0}) + 1
	if n > maxArgs {
		return nil, fmt.Errorf("%w: more than %d arguments", ErrTooLarge, maxArgs)
	}
	out := make([]string, 0, n)
	for _, a := range bytes.Split(b, []byte{0}) {
		out = append(out, string(a))
	}
	return out, nil
}

// ReadCmdline reads /proc/PID/cmdline.
func ReadCmdline(pid int) ([]string, error) {
	b, err := ReadFile(pidPath(pid, "cmdline"), maxCmdline)
	if err != nil {
		return nil, fmt.Errorf("read cmdline: %w", err)
	}
	return ParseCmdline(b)
}

// Cwd returns the target of /proc/PID/cwd.
func Cwd(pid int) (string, error) { return readLink(pidPath(pid, "cwd")) }

// Root returns the target of /proc/PID/root.
func Root(pid int) (string, error) { return readLink(pidPath(pid, "root")) }

// Exe returns the target of /proc/PID/exe (with " (deleted)" if the
// executable was deleted).
func Exe(pid int) (string, error) { return readLink(pidPath(pid, "exe")) }

func readLink(path string) (string, error) {
	s, err := os.Readlink(path)
	if err != nil {
		return "", fmt.Errorf("readlink: %w", err)
	}
	return s, nil
}

// FileID identifies a file's contents for a later check that it did not
// change: device, inode, size and modification time, with the mode.
type FileID struct {
	Dev   uint64 // st_dev, as the kernel encodes it (unix.Major/Minor)
	Ino   uint64
	Mode  uint32 // st_mode: type and permission bits
	Rdev  uint64
	Nlink uint64
	Size  int64
	Mtime time.Time
}

// StatFile returns the FileID of path, following symlinks (so a /proc
// magic link names the file it opens, even a deleted one).
func StatFile(path string) (FileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return FileID{}, fmt.Errorf("stat %s: %w", path, err)
	}
	return FileID{
		Dev:   st.Dev,
		Ino:   st.Ino,
		Mode:  st.Mode,
		Rdev:  st.Rdev,
		Nlink: uint64(st.Nlink),
		Size:  st.Size,
		Mtime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
	}, nil
}

// ExeFile returns the identity of the process's executable through
// /proc/PID/exe, which opens it even when it was deleted or replaced.
func ExeFile(pid int) (FileID, error) { return StatFile(pidPath(pid, "exe")) }

// Personality reads /proc/PID/personality (hex; needs ptrace access).
func Personality(pid int) (uint32, error) {
	b, err := ReadFile(pidPath(pid, "personality"), 64)
	if err != nil {
		return 0, fmt.Errorf("read personality: %w", err)
	}
	v, ok := parseUint(trimSpace(b), 16)
	if !ok || v > 1<<32-1 {
		return 0, fmt.Errorf("personality: %w", Malformed("hex", b))
	}
	return uint32(v), nil
}

// TimerSlack reads /proc/PID/timerslack_ns.
func TimerSlack(pid int) (uint64, error) {
	b, err := ReadFile(pidPath(pid, "timerslack_ns"), 64)
	if err != nil {
		return 0, fmt.Errorf("read timerslack_ns: %w", err)
	}
	v, ok := parseUint(trimSpace(b), 10)
	if !ok {
		return 0, fmt.Errorf("timerslack_ns: %w", Malformed("integer", b))
	}
	return v, nil
}

// Tasks lists the thread ids in /proc/PID/task, in ascending order.
// Threads come and go while a process runs: read it again after stopping
// them until two reads agree.
func Tasks(pid int) ([]int, error) {
	return listPids(pidPath(pid, "task"))
}

// FDNums lists the open descriptor numbers in /proc/PID/fd, ascending.
func FDNums(pid int) ([]int, error) {
	return listPids(pidPath(pid, "fd"))
}

func listPids(dir string) ([]int, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	defer f.Close()
	var out []int
	for {
		names, err := f.Readdirnames(1024)
		for _, n := range names {
			v, err := strconv.Atoi(n)
			if err != nil || v < 0 {
				continue
			}
			if len(out) >= maxTasks {
				return nil, fmt.Errorf("list %s: %w: more than %d entries", dir, ErrTooLarge, maxTasks)
			}
			out = append(out, v)
		}
		if err != nil || len(names) == 0 {
			break
		}
	}
	sort.Ints(out)
	return out, nil
}

// ParsePidList parses a space-separated list of pids, as in
// /proc/PID/task/TID/children.
func ParsePidList(b []byte) ([]int, error) {
	if len(b) > MaxSmallFile {
		return nil, fmt.Errorf("%w: pid list longer than %d bytes", ErrTooLarge, MaxSmallFile)
	}
	var out []int
	for {
		var f []byte
		f, b = nextField(trimSpace(b))
		if len(f) == 0 {
			return out, nil
		}
		v, err := pidField(f)
		if err != nil || v <= 0 {
			return nil, Malformed("pid list", f)
		}
		out = append(out, v)
	}
}

// Children returns the children of every thread of pid, from
// /proc/PID/task/TID/children, in ascending order. (A child belongs to
// the thread that created it.)
func Children(pid int) ([]int, error) {
	tids, err := Tasks(pid)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, tid := range tids {
		b, err := ReadFile(taskPath(pid, tid, "children"), MaxSmallFile)
		if err != nil {
			if os.IsNotExist(err) {
				continue // the thread exited
			}
			return nil, fmt.Errorf("read children: %w", err)
		}
		c, err := ParsePidList(b)
		if err != nil {
			return nil, fmt.Errorf("parse children of %d/%d: %w", pid, tid, err)
		}
		out = append(out, c...)
	}
	sort.Ints(out)
	return out, nil
}
