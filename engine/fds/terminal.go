package fds

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
)

// Terminals. A descriptor on a terminal outside the process (or the tree)
// is never reopened by its path at restore: the pty it names may be gone,
// or be another session's by then, whose user would see the process
// write there. As CRIU's --shell-job: the dump records it as leading
// outside (TerminalKey) only when asked (--shell-job), and the restore
// gives it the caller's own terminal (RestoreOptions.ShellJob, the
// terminal in Inherit[TerminalKey]: restore --shell-job), set as the
// job's was (SetTerminal), or --inherit-fd's descriptor for tty, or
// /dev/null. A terminal whose pseudo-terminal master the processes hold
// is a pair inside, rebuilt (pty.go); any other master is refused.

// TerminalKey is the key (image.FD.External) of a descriptor on a terminal
// outside the process.
const TerminalKey = "tty"

// statelessDevices are the character devices other than terminals that a
// reopen restores whole, all of major 1: /dev/null, zero, full, random
// and urandom. (/dev/kmsg, 1:11, keeps a read position per open file: a
// reopen would replay the log; /dev/mem and /dev/port, positions in
// memory.)
var statelessDevices = map[uint64]bool{
	unix.Mkdev(1, 3): true, unix.Mkdev(1, 5): true, unix.Mkdev(1, 7): true, unix.Mkdev(1, 8): true, unix.Mkdev(1, 9): true,
}

// isTerminal reports whether a character device is a terminal: a virtual
// console or serial line (major 4), /dev/tty or /dev/console (5:0, 5:1),
// a pseudo-terminal slave (136-143), or a pseudo-terminal master (the
// multiplexer 5:2, and the BSD-style majors 2 and 128-135).
func isTerminal(rdev uint64) (terminal, master bool) {
	major, minor := unix.Major(rdev), unix.Minor(rdev)
	switch {
	case major == 5 && minor == 2, major == 2, major >= 128 && major <= 135:
		return true, true
	case major == 4, major == 5 && minor <= 1, major >= 136 && major <= 143:
		return true, false
	}
	return false, false
}

// terminal records descriptor f, on a terminal, as leading outside, or
// refuses it.
func (fx *fdDumper) terminal(f *proc.FD, out image.FD, master bool) (image.FD, error) {
	if master {
		return out, fmt.Errorf("%w: fd %d is a pseudo-terminal master (%s) of a kind restore cannot rebuild (a legacy BSD pty, or a kernel that does not show its pair's number)", image.ErrUnsupported, f.Num, f.Path)
	}
	if !fx.shellJob {
		return out, fmt.Errorf("%w: fd %d is the terminal %s, outside the process: dump with --shell-job, then restore with --shell-job, which gives it snapctl's terminal", ErrExternal, f.Num, f.Path)
	}
	out.Kind = image.FDChr
	out.Path = f.Path
	out.Rdev = f.Stat.Rdev
	fx.external(f, &out, TerminalKey)
	if tio, err := readTermios(fx.pid, f.Num); err != nil {
		fx.log.Warn("terminal settings not read: restore --shell-job leaves its terminal's as they are", "pid", fx.pid, "fd", f.Num, "err", err)
	} else {
		out.Termios = tio
	}
	return out, nil
}

// readTermios reads the settings of the terminal fd of pid is open on,
// through a descriptor of our own on it (not its controlling terminal).
func readTermios(pid, fd int) (*image.Termios, error) {
	tfd, err := unix.Open(fmt.Sprintf("/proc/%d/fd/%d", pid, fd), unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(tfd)
	t, err := unix.IoctlGetTermios(tfd, unix.TCGETS)
	if err != nil {
		return nil, fmt.Errorf("TCGETS: %w", err)
	}
	tio := termiosImage(t)
	return &tio, nil
}

// SetTerminal gives the terminal fd (restore --shell-job's own) the
// settings the processes' terminal had at the dump (the first descriptor
// on it that recorded them), as a job that had set its terminal (raw
// mode, no echo) expects to find it. Nothing recorded: nothing changes.
func SetTerminal(fd int, sts []*image.Process) error {
	for _, st := range sts {
		for _, f := range st.FDs {
			if t := f.Termios; t != nil && f.External == TerminalKey {
				if err := unix.IoctlSetTermios(fd, unix.TCSETS, termiosOf(t)); err != nil {
					return fmt.Errorf("set the terminal's settings (TCSETS): %w", err)
				}
				return nil
			}
		}
	}
	return nil
}
