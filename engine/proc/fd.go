package proc

import (
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// FDKind classifies an open file description.
type FDKind int

// File descriptor kinds.
const (
	FDUnknown     FDKind = iota
	FDFile               // regular file
	FDDir                // directory
	FDCharDev            // character device
	FDBlockDev           // block device
	FDFIFO               // named FIFO (a path on a filesystem)
	FDPipe               // anonymous pipe: "pipe:[INO]"
	FDSocket             // "socket:[INO]"
	FDMemfd              // "/memfd:NAME (deleted)"
	FDEventfd            // anon_inode:[eventfd]
	FDEpoll              // anon_inode:[eventpoll]
	FDTimerfd            // anon_inode:[timerfd]
	FDSignalfd           // anon_inode:[signalfd]
	FDInotify            // anon_inode:inotify
	FDFanotify           // anon_inode:[fanotify]
	FDUserfaultfd        // anon_inode:[userfaultfd]
	FDPidfd              // anon_inode:[pidfd] or pidfd:[INO]
	FDNamespace          // a namespace file: "net:[INO]", "mnt:[INO]", ...
	FDAnonInode          // any other anon_inode: io_uring, perf_event, bpf ...
)

var fdKindNames = [...]string{
	"unknown", "file", "dir", "chardev", "blockdev", "fifo", "pipe", "socket",
	"memfd", "eventfd", "epoll", "timerfd", "signalfd", "inotify", "fanotify",
	"userfaultfd", "pidfd", "namespace", "anon_inode",
}

func (k FDKind) String() string {
	if k >= 0 && int(k) < len(fdKindNames) {
		return fdKindNames[k]
	}
	return "FDKind(" + strconv.Itoa(int(k)) + ")"
}

// FD is one open file descriptor of a process.
type FD struct {
	Num    int
	Target string // the readlink of /proc/PID/fd/N, as the kernel shows it
	Kind   FDKind
	// Path is Target without " (deleted)" for files, the name after
	// "anon_inode:" for anon inodes, empty for pipes and sockets.
	Path    string
	Deleted bool
	// Ino is the inode number in "pipe:[INO]", "socket:[INO]" and
	// "net:[INO]" targets, else Stat.Ino.
	Ino  uint64
	Info *FDInfo
	// Stat identifies the open file (stat through /proc/PID/fd/N).
	Stat FileID
}

// ClassifyTarget classifies a /proc/PID/fd/N link target. mode is the
// st_mode of the open file if known (0 if not): it tells a named FIFO, a
// device or a directory from a regular file. It returns the kind, the
// path (see FD.Path), whether the file was deleted and, for pipe:[N],
// socket:[N] and namespace targets, the inode.
func ClassifyTarget(target string, mode uint32) (kind FDKind, path string, deleted bool, ino uint64) {
	if rest, ok := strings.CutPrefix(target, "anon_inode:"); ok {
		switch rest {
		case "[eventfd]":
			kind = FDEventfd
		case "[eventpoll]":
			kind = FDEpoll
		case "[timerfd]":
			kind = FDTimerfd
		case "[signalfd]":
			kind = FDSignalfd
		case "inotify":
			kind = FDInotify
		case "[fanotify]":
			kind = FDFanotify
		case "[userfaultfd]":
			kind = FDUserfaultfd
		case "[pidfd]":
			kind = FDPidfd
		default:
			kind = FDAnonInode
		}
		return kind, rest, false, 0
	}
	if !strings.HasPrefix(target, "/") {
		// "type:[inode]" for pipes, sockets, namespaces, pidfs.
		name, rest, ok := strings.Cut(target, ":[")
		num, ok2 := strings.CutSuffix(rest, "]")
		if ok && ok2 {
			ino, err := strconv.ParseUint(num, 10, 64)
			if err == nil {
				switch name {
				case "pipe":
					return FDPipe, "", false, ino
				case "socket":
					return FDSocket, "", false, ino
				case "pidfd":
					return FDPidfd, "", false, ino
				case "net", "mnt", "uts", "ipc", "pid", "user", "cgroup", "time":
					return FDNamespace, name, false, ino
				}
			}
		}
		return FDUnknown, target, false, 0
	}
	path, deleted = strings.CutSuffix(target, deletedSuffix)
	if deleted && strings.HasPrefix(path, "/memfd:") {
		return FDMemfd, path, true, 0
	}
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		kind = FDDir
	case unix.S_IFCHR:
		kind = FDCharDev
	case unix.S_IFBLK:
		kind = FDBlockDev
	case unix.S_IFIFO:
		kind = FDFIFO
	case unix.S_IFSOCK:
		kind = FDSocket
	default:
		kind = FDFile
	}
	return kind, path, deleted, 0
}

// ReadFD reads one descriptor: its link target, fdinfo and the stat of
// the open file.
func ReadFD(pid, fd int) (*FD, error) {
	name := "fd/" + strconv.Itoa(fd)
	target, err := readLink(pidPath(pid, name))
	if err != nil {
		return nil, fmt.Errorf("fd %d: %w", fd, err)
	}
	st, err := StatFile(pidPath(pid, name))
	if err != nil {
		return nil, fmt.Errorf("fd %d: %w", fd, err)
	}
	info, err := ReadFDInfo(pid, fd)
	if err != nil {
		return nil, err
	}
	f := &FD{Num: fd, Target: target, Info: info, Stat: st}
	f.Kind, f.Path, f.Deleted, f.Ino = ClassifyTarget(target, st.Mode)
	if f.Ino == 0 {
		f.Ino = st.Ino
	}
	return f, nil
}

// ReadFDInfo reads /proc/PID/fdinfo/FD.
func ReadFDInfo(pid, fd int) (*FDInfo, error) {
	b, err := ReadFile(pidPath(pid, "fdinfo/"+strconv.Itoa(fd)), MaxSmallFile)
	if err != nil {
		return nil, fmt.Errorf("fd %d: read fdinfo: %w", fd, err)
	}
	info, err := ParseFDInfo(b)
	if err != nil {
		return nil, fmt.Errorf("fd %d: parse fdinfo: %w", fd, err)
	}
	return info, nil
}

// ReadFDs reads every open descriptor of pid, in ascending order. A
// descriptor closed while the list is read is skipped (a stopped process
// closes none).
func ReadFDs(pid int) ([]FD, error) {
	nums, err := FDNums(pid)
	if err != nil {
		return nil, err
	}
	out := make([]FD, 0, len(nums))
	for _, n := range nums {
		f, err := ReadFD(pid, n)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOENT) {
				continue
			}
			return nil, err
		}
		out = append(out, *f)
	}
	return out, nil
}

// Pipe is an anonymous pipe and the descriptors that hold its ends.
type Pipe struct {
	Ino     uint64
	Readers []int // fds open for reading (O_RDONLY)
	Writers []int // fds open for writing
}

// GroupPipes groups the pipe descriptors of fds by pipe inode, in order
// of each pipe's lowest fd. fds without FDInfo count as readers.
func GroupPipes(fds []FD) []Pipe {
	var out []Pipe
	index := map[uint64]int{}
	for i := range fds {
		f := &fds[i]
		if f.Kind != FDPipe {
			continue
		}
		j, ok := index[f.Ino]
		if !ok {
			j = len(out)
			index[f.Ino] = j
			out = append(out, Pipe{Ino: f.Ino})
		}
		if f.Info != nil && f.Info.Flags&unix.O_ACCMODE != unix.O_RDONLY {
			out[j].Writers = append(out[j].Writers, f.Num)
		} else {
			out[j].Readers = append(out[j].Readers, f.Num)
		}
	}
	return out
}
