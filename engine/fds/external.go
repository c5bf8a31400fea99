package fds

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds/broker"
	"github.com/lazyfs/lazyfs/engine/fds/tty"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
)

// Descriptors that lead outside the process: a pipe whose other end
// another process holds (the stdout of a daemon started from a shell, a
// pipe to its supervisor), a unix stream socket connected to a process
// outside. Dump refuses such a pipe, and restores such a socket closed,
// unless --external names it; it is then recorded by its key, the
// kernel's name of it ("pipe:[INO]", "socket:[INO]"). Restore puts in its
// place a descriptor of its own that the caller hands it for that key
// (--inherit-fd fd[N]:KEY, as CRIU has it), or /dev/null, or refuses.
//
// In a process tree, outside means outside the tree: a pipe or socket
// pair between two processes of the tree is restored as such (tree.go),
// a descriptor a child inherited is handed over from its parent, and the
// keys of --external and --inherit-fd are checked against the whole
// tree.

// External says which descriptors leading outside a dump records
// (--external). Resources are "stdio" (fds 0, 1 and 2, those of them
// that lead outside), "fd[N]", "pipe[INO]" or "pipe:[INO]", and
// "unix[INO]" or "socket:[INO]".
type External struct {
	FDs    map[int]bool
	Inodes map[uint64]bool
	stdio  bool
	given  []string
}

var externalForm = regexp.MustCompile(`^(fd|pipe|unix|socket):?\[([0-9]+)\]$`)

// ParseExternal parses the resources of --external, each one of the
// forms External lists.
func ParseExternal(res []string) (*External, error) {
	e := &External{FDs: map[int]bool{}, Inodes: map[uint64]bool{}}
	for _, r := range res {
		e.given = append(e.given, r)
		if r == "stdio" {
			e.stdio = true
			continue
		}
		m := externalForm.FindStringSubmatch(r)
		if m == nil {
			return nil, fmt.Errorf("--external %q: want stdio, fd[N], pipe[INO] or unix[INO]", r)
		}
		n, err := strconv.ParseUint(m[2], 10, 63)
		if err != nil {
			return nil, fmt.Errorf("--external %q: %w", r, err)
		}
		if m[1] == "fd" {
			e.FDs[int(n)] = true
		} else {
			e.Inodes[n] = true
		}
	}
	return e, nil
}

// matches reports whether descriptor f is one e names.
func (e *External) matches(f *proc.FD) bool {
	return e != nil && (e.FDs[f.Num] || e.Inodes[f.Ino] || e.stdio && f.Num <= 2)
}

// checkUsed refuses a resource named by fd or inode that the dump found
// nowhere among the descriptors leading outside the processes pids (one,
// or every process of a tree, used then gathered from all of them): a
// typo would otherwise go unnoticed until the refusal it was meant to
// avoid.
func (e *External) checkUsed(pids []int, used map[string]bool) error {
	if e == nil {
		return nil
	}
	for n := range e.FDs {
		if used[fmt.Sprintf("fd[%d]", n)] {
			continue
		}
		if len(pids) == 1 {
			return fmt.Errorf("--external fd[%d]: fd %d of pid %d is not a pipe or unix socket whose other end is outside it", n, n, pids[0])
		}
		return fmt.Errorf("--external fd[%d]: no process of the tree of pid %d has an fd %d that is a pipe or unix socket whose other end is outside the tree", n, pids[0], n)
	}
	for ino := range e.Inodes {
		if used[fmt.Sprintf("ino[%d]", ino)] {
			continue
		}
		if len(pids) == 1 {
			return fmt.Errorf("--external: pid %d holds no pipe or unix socket of inode %d whose other end is outside it", pids[0], ino)
		}
		return fmt.Errorf("--external: no process of the tree of pid %d holds a pipe or unix socket of inode %d whose other end is outside the tree", pids[0], ino)
	}
	return nil
}

// outsideIfNamed records f as a descriptor leading outside, by its key,
// if --external names it.
func (fx *fdDumper) outsideIfNamed(f *proc.FD, out *image.FD, key string) {
	if fx.ext.matches(f) {
		fx.external(f, out, key)
	}
}

// terminalOutside records f, a terminal outside the process, as leading
// outside (tty.TerminalKey) with --shell-job, or refuses it.
func (fx *fdDumper) terminalOutside(f *proc.FD, out *image.FD) error {
	if !fx.shellJob {
		return fmt.Errorf("%w: fd %d is the terminal %s, outside the process: dump with --shell-job, then restore with --shell-job, which gives it snapctl's terminal", ErrExternal, f.Num, f.Path)
	}
	fx.external(f, out, tty.TerminalKey)
	return nil
}

// external records f as a descriptor leading outside, by its key.
func (fx *fdDumper) external(f *proc.FD, out *image.FD, key string) {
	out.External = key
	fx.used[fmt.Sprintf("fd[%d]", f.Num)] = true
	fx.used[fmt.Sprintf("ino[%d]", f.Ino)] = true
	fx.log.Info("descriptor leading outside recorded", "pid", fx.pid, "fd", f.Num, "key", key)
}

// Fallbacks of restore for a descriptor leading outside that no
// --inherit-fd gives.
const (
	ExternalRefuse = "refuse" // refuse the restore, naming it (the default)
	ExternalNull   = "null"   // open /dev/null in its place
)

// ErrExternal: a descriptor leading outside the process has no
// descriptor to take its place.
var ErrExternal = fmt.Errorf("%w: descriptor leading outside the process", image.ErrUnsupported)

// inheritKey parses the KEY of --inherit-fd fd[N]:KEY.
var inheritForm = regexp.MustCompile(`^fd\[([0-9]+)\]:(.+)$`)

// ParseInherit parses --inherit-fd values fd[N]:KEY into KEY -> N, where
// N is a descriptor of the caller and KEY the key of a descriptor leading
// outside ("pipe:[INO]", "socket:[INO]", "tty" for a terminal) or
// "fd[M]", descriptor M of the dumped process.
func ParseInherit(vals []string) (map[string]int, error) {
	out := map[string]int{}
	for _, v := range vals {
		m := inheritForm.FindStringSubmatch(v)
		if m == nil {
			return nil, fmt.Errorf("--inherit-fd %q: want fd[N]:KEY, KEY pipe:[INO], socket:[INO] or fd[M]", v)
		}
		n, err := strconv.Atoi(m[1])
		if err != nil {
			return nil, fmt.Errorf("--inherit-fd %q: %w", v, err)
		}
		key := m[2]
		if !strings.HasPrefix(key, "fd[") && !strings.HasPrefix(key, "pipe:[") && !strings.HasPrefix(key, "socket:[") && key != tty.TerminalKey {
			return nil, fmt.Errorf("--inherit-fd %q: KEY %q is not pipe:[INO], socket:[INO], tty or fd[M]", v, key)
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("--inherit-fd: %s given twice", key)
		}
		var st unix.Stat_t
		if err := unix.Fstat(n, &st); err != nil {
			return nil, fmt.Errorf("--inherit-fd %q: fd %d: %w", v, n, err)
		}
		out[key] = n
	}
	return out, nil
}

// inherited returns the caller's descriptor that takes f's place, if one
// was given by its key or by its number.
func inherited(f *image.FD, o RestoreOptions) (int, string, bool) {
	for _, k := range []string{f.External, fmt.Sprintf("fd[%d]", f.FD)} {
		if n, ok := o.Inherit[k]; ok {
			return n, k, true
		}
	}
	return -1, "", false
}

// CheckExternal refuses, before the restore creates anything, a
// descriptor leading outside that neither an inherited descriptor nor
// the fallback fills, and an inherited descriptor for a key the snapshot
// does not have. sts are the processes restored together: one, or every
// process of a tree, whose keys are checked together (a key may be
// given for a descriptor of any of them).
func CheckExternal(sts []*image.Process, o RestoreOptions) error {
	where := "the process"
	if len(sts) > 1 {
		where = "the tree"
	}
	used := map[string]bool{}
	for _, st := range sts {
		for i := range st.FDs {
			f := &st.FDs[i]
			if f.External == "" || f.SameAs != nil {
				continue
			}
			if _, k, ok := inherited(f, o); ok {
				used[k] = true
				continue
			}
			if o.ExternalFallback == ExternalNull {
				continue
			}
			if f.External == tty.TerminalKey {
				return fmt.Errorf("%w: fd %d of pid %d was the terminal %s, outside %s: restore with --shell-job to give it snapctl's terminal, or --inherit-fd fd[N]:%s, or --external-fallback null",
					ErrExternal, f.FD, st.PID, f.Path, where, tty.TerminalKey)
			}
			return fmt.Errorf("%w: fd %d of pid %d is %s, whose other end was outside %s: give a descriptor for it with --inherit-fd fd[N]:%s (or fd[N]:fd[%d]), or --external-fallback null",
				ErrExternal, f.FD, st.PID, f.External, where, f.External, f.FD)
		}
	}
	for k := range o.Inherit {
		if used[k] || k == tty.TerminalKey && o.ShellJob {
			continue
		}
		if len(sts) == 1 {
			return fmt.Errorf("--inherit-fd ...:%s: pid %d has no descriptor leading outside by that key", k, sts[0].PID)
		}
		return fmt.Errorf("--inherit-fd ...:%s: no process of the tree of pid %d has a descriptor leading outside by that key", k, sts[0].PID)
	}
	return nil
}

// external puts the descriptor that takes the place of f in the
// process: the caller's inherited one (the same open file), or /dev/null.
func (fc *fdCreator) external(f *image.FD) (int, error) {
	if n, k, ok := inherited(f, fc.opts); ok {
		fd, err := fc.passFD(n, f.CloExec)
		if err != nil {
			return -1, fmt.Errorf("hand over fd %d for %s: %w", n, k, err)
		}
		fc.log.Info("descriptor leading outside inherited", "fd", f.FD, "key", f.External, "from", n)
		return fd, nil
	}
	if fc.opts.ExternalFallback != ExternalNull {
		return -1, fmt.Errorf("%w: fd %d is %s (no --inherit-fd for it)", ErrExternal, f.FD, f.External)
	}
	flags := unix.O_RDWR
	if f.Kind == image.FDPipe {
		flags = f.Flags & unix.O_ACCMODE
	}
	if f.CloExec {
		flags |= unix.O_CLOEXEC
	}
	fd, err := fc.in.OpenAt2("/dev/null", flags, 0, resolveNoLinks)
	if err != nil {
		return -1, fmt.Errorf("open /dev/null for %s: %w", f.External, err)
	}
	fc.log.Warn("descriptor leading outside is /dev/null", "pid", fc.st.PID, "fd", f.FD, "key", f.External)
	return fd, nil
}

// passFD gives the process a descriptor of the same open file as our fd
// n (broker.PassFD).
func (fc *fdCreator) passFD(n int, cloexec bool) (int, error) {
	pidfd, err := fc.Pidfd()
	if err != nil {
		return -1, err
	}
	return broker.PassFD(fc.in, pidfd, n, cloexec)
}

// Pidfd returns a pidfd of the process under restore, opened once.
func (fc *fdCreator) Pidfd() (int, error) {
	if fc.pfd >= 0 {
		return fc.pfd, nil
	}
	fd, err := unix.PidfdOpen(fc.pid, 0)
	if err != nil {
		return -1, fmt.Errorf("pidfd_open %d: %w", fc.pid, err)
	}
	fc.pfd = fd
	return fd, nil
}
