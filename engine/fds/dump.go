package fds

import (
	"fmt"
	"log/slog"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/proc/sockdiag"
)

// DumpOptions configure Dump.
type DumpOptions struct {
	Log *slog.Logger
	// TCP, if set, takes established TCP connections with TCP_REPAIR
	// under its lock (--tcp-established); otherwise they are recorded to
	// be closed at restore.
	TCP *TCPRepair
	// External names the pipes and unix sockets leading outside the
	// process that are recorded rather than refused or closed.
	External *External
	// ShellJob records descriptors on a terminal outside the process as
	// leading outside (TerminalKey); without it they are refused.
	ShellJob bool
	// GhostLimit is the largest open file that was deleted whose contents
	// the dump keeps (ghost.go); 0 is DefaultGhostLimit, -1 none.
	GhostLimit int64
}

// Dump describes every open file descriptor of the frozen process pid,
// whose memory mappings are maps, or refuses the first one the snapshot
// format cannot describe, naming it.
func Dump(pid int, maps []proc.Mapping, o DumpOptions) ([]image.FD, error) {
	fds, err := proc.ReadFDs(pid)
	if err != nil {
		return nil, err
	}
	fx, err := newFDDumper(pid, maps, fds, nil, o, map[string]bool{})
	if err != nil {
		return nil, err
	}
	defer fx.close()
	if fx.ptys, err = ptyMasters([]int{pid}, fds); err != nil {
		return nil, err
	}
	if o.TCP != nil {
		if err := lockConns(o.TCP, []*fdDumper{fx}); err != nil {
			return nil, err
		}
	}
	out, err := fx.dump()
	if err != nil {
		return nil, err
	}
	if err := o.External.checkUsed([]int{pid}, fx.used); err != nil {
		return nil, err
	}
	return out, nil
}

// newFDDumper prepares the description of fds, the descriptors of pid;
// td, if not nil, is what it knows of the other processes of its tree;
// used collects the descriptors o.External matched (shared by the
// processes of a tree). The caller closes it.
func newFDDumper(pid int, maps []proc.Mapping, fds []proc.FD, td *treeDumper, o DumpOptions, used map[string]bool) (*fdDumper, error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pid %d: pidfd_open: %w", pid, err)
	}
	fx := &fdDumper{pid: pid, maps: maps, log: log, pidfd: pidfd, all: fds, pipes: map[uint64]*pipeEnds{}, tree: td,
		tcp: o.TCP, ext: o.External, used: used, shellJob: o.ShellJob, ghostLimit: o.GhostLimit}
	for _, p := range proc.GroupPipes(fds) {
		fx.pipes[p.Ino] = &pipeEnds{readers: p.Readers, writers: p.Writers}
	}
	return fx, nil
}

func (fx *fdDumper) close() { unix.Close(fx.pidfd) }

// dump describes the descriptors of the process.
func (fx *fdDumper) dump() ([]image.FD, error) {
	fds := fx.all
	var out []image.FD
	shared := fx.sharedFiles()
	for i := range fds {
		if r := fx.tree.inherited(fds[i].Num); r != nil {
			// Described in the process it is inherited from.
			out = append(out, inheritedFD(&fds[i], r))
			continue
		}
		f, err := fx.fd(&fds[i])
		if err != nil {
			return nil, fmt.Errorf("pid %d fd %d (%s): %w", fx.pid, fds[i].Num, fds[i].Target, err)
		}
		if first, ok := shared[fds[i].Num]; ok {
			f.SameAs = &first
		}
		out = append(out, f)
	}
	return out, nil
}

// sharedFiles maps each descriptor that shares its open file description
// with a lower-numbered one (dup, dup2, fork-inherited, SCM_RIGHTS) to the
// lowest such number. Only descriptors on the same inode with the same
// flags can share one; kcmp(KCMP_FILE) tells whether they do.
func (fx *fdDumper) sharedFiles() map[int]int {
	type key struct {
		dev, ino uint64
		flags    uint32
	}
	groups := map[key][]int{}
	for i := range fx.all {
		f := &fx.all[i]
		if f.Info == nil {
			continue
		}
		k := key{f.Stat.Dev, f.Stat.Ino, f.Info.Flags &^ unix.O_CLOEXEC}
		groups[k] = append(groups[k], f.Num)
	}
	out := map[int]int{}
	for _, nums := range groups {
		for i := 1; i < len(nums); i++ {
			for _, first := range nums[:i] {
				if _, dup := out[first]; dup {
					continue // compare with the first of each group only
				}
				if sameFile(fx.pid, first, nums[i]) {
					out[nums[i]] = first
					break
				}
			}
		}
	}
	return out
}

// sameFile reports whether fds a and b of pid are the same open file.
func sameFile(pid, a, b int) bool {
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(pid), uintptr(pid), kcmpFile, uintptr(a), uintptr(b), 0)
	return errno == 0 && r == 0
}

// kcmpFile is KCMP_FILE (linux/kcmp.h).
const kcmpFile = 0

type fdDumper struct {
	pid   int
	maps  []proc.Mapping
	log   *slog.Logger
	pidfd int
	all   []proc.FD
	pipes map[uint64]*pipeEnds
	inet  map[uint64]sockdiag.InetDiag
	unixd map[uint64]sockdiag.UnixDiag
	tree  *treeDumper // the other processes of the tree, or nil
	tcp   *TCPRepair
	ext   *External
	used  map[string]bool // fd[N] and ino[INO] of the descriptors External matched
	// shellJob: terminals are recorded as leading outside (terminal.go).
	shellJob bool
	// ghostLimit bounds a deleted file kept; ghosts maps one (device,
	// inode) to its first descriptor (ghost.go).
	ghostLimit int64
	ghosts     map[[2]uint64]int
	// ptys are the pseudo-terminal pairs whose master the process (or
	// the tree) holds (pty.go).
	ptys ptyPairs
}

// fd describes one descriptor: its number and flags, the file locks held
// through it, and what it is (fdKind).
func (fx *fdDumper) fd(f *proc.FD) (image.FD, error) {
	out, err := fx.fdKind(f)
	if err != nil || len(f.Info.Locks) == 0 {
		return out, err
	}
	if out.Locks, err = parseLocks(f.Info.Locks); err != nil {
		return out, fmt.Errorf("fd %d: %w", f.Num, err)
	}
	return out, nil
}

// fdKind describes one descriptor: its number and flags here, what it is
// in the function for its kind.
func (fx *fdDumper) fdKind(f *proc.FD) (image.FD, error) {
	out := image.FD{FD: f.Num}
	if f.Info == nil {
		return out, fmt.Errorf("no fdinfo")
	}
	flags := int(f.Info.Flags)
	out.CloExec = flags&unix.O_CLOEXEC != 0
	out.Flags = flags &^ unix.O_CLOEXEC
	switch f.Kind {
	case proc.FDCharDev:
		if f.Stat.Rdev == ptmxRdev && f.Info.TTYIndex >= 0 && fx.ptys[f.Info.TTYIndex] != nil {
			return fx.pty(f, out, f.Info.TTYIndex, true)
		}
		if idx, ok := fx.ptys.of(f.Stat.Rdev); ok {
			return fx.pty(f, out, idx, false)
		}
		if tty, master := isTerminal(f.Stat.Rdev); tty {
			return fx.terminal(f, out, master)
		}
		if !statelessDevices[f.Stat.Rdev] {
			// A driver's state lives in its open file (a FUSE
			// connection, a TUN interface, a GPU context, a position
			// in the kernel log): reopening the path makes a new one.
			return out, fmt.Errorf("%w: fd %d is the character device %s (%d:%d): a reopened device would not hold the state of the open one; only /dev/null, zero, full, random, urandom and terminals are restored",
				image.ErrUnsupported, f.Num, f.Path, unix.Major(f.Stat.Rdev), unix.Minor(f.Stat.Rdev))
		}
		return dumpFile(f, out)
	case proc.FDFile:
		if f.Deleted {
			return fx.ghost(f, out)
		}
		return dumpFile(f, out)
	case proc.FDDir, proc.FDFIFO:
		return dumpFile(f, out)
	case proc.FDMemfd:
		return fx.memfd(f, out)
	case proc.FDPipe:
		return fx.pipe(f, out)
	case proc.FDEventfd:
		return dumpEventfd(f, out)
	case proc.FDEpoll:
		return fx.epoll(f, out)
	case proc.FDTimerfd:
		return dumpTimerfd(f, out)
	case proc.FDSignalfd:
		return dumpSignalfd(f, out)
	case proc.FDSocket:
		return fx.socket(f, out)
	}
	return out, fmt.Errorf("%w: %s file descriptors cannot be dumped yet", image.ErrUnsupported, f.Kind)
}

// open reports whether fd num is open on inode ino.
func (fx *fdDumper) open(num int, ino uint64) bool {
	for _, f := range fx.all {
		if f.Num == num {
			return f.Stat.Ino == ino || f.Ino == ino
		}
	}
	return false
}

// mapped reports whether a shared mapping of inode ino exists.
func (fx *fdDumper) mapped(ino uint64) bool {
	for i := range fx.maps {
		if m := &fx.maps[i]; m.IsShmem() && m.Inode == ino {
			return true
		}
	}
	return false
}
