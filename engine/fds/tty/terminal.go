package tty

import (
	"fmt"
	"log/slog"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
)

// Terminals. A descriptor on a terminal outside the process (or the tree)
// is never reopened by its path at restore: the pty it names may be gone,
// or be another session's by then, whose user would see the process
// write there. As CRIU's --shell-job: the dump records it as leading
// outside (TerminalKey) only when asked (--shell-job), and the restore
// gives it the caller's own terminal (fds.RestoreOptions.ShellJob, the
// terminal in Inherit[TerminalKey]: restore --shell-job), set as the
// job's was (SetTerminal), or --inherit-fd's descriptor for tty, or
// /dev/null. A terminal whose pseudo-terminal master the processes hold
// is a pair inside, rebuilt (pty.go); any other master is refused.

// TerminalKey is the key (image.FD.External) of a descriptor on a terminal
// outside the process.
const TerminalKey = "tty"

// Dumper describes the descriptors of one process (of a tree, or alone)
// on terminals.
type Dumper struct {
	PID   int
	PIDFD int // a pidfd of the process: copies of its descriptors are taken through it
	Log   *slog.Logger
	// Pairs are the pairs whose master the process, or its tree, holds
	// (Masters).
	Pairs Pairs
	// Outside records f, a terminal outside the processes, as leading
	// outside (TerminalKey: dump --shell-job), or refuses it.
	Outside func(f *proc.FD, out *image.FD) error
}

// CharDev describes f, a character device, if it is a terminal: an end
// of a pair whose master the processes hold, or a terminal outside them;
// ok is false for any other device.
func (d *Dumper) CharDev(f *proc.FD, out image.FD) (_ image.FD, ok bool, err error) {
	if f.Stat.Rdev == ptmxRdev && f.Info.TTYIndex >= 0 && d.Pairs[f.Info.TTYIndex] != nil {
		out, err = d.pty(f, out, f.Info.TTYIndex, true)
		return out, true, err
	}
	if idx, ok := d.Pairs.withSlave(f.Stat.Rdev); ok {
		out, err = d.pty(f, out, idx, false)
		return out, true, err
	}
	if tty, master := isTerminal(f.Stat.Rdev); tty {
		out, err = d.terminal(f, out, master)
		return out, true, err
	}
	return out, false, nil
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
func (d *Dumper) terminal(f *proc.FD, out image.FD, master bool) (image.FD, error) {
	if master {
		return out, fmt.Errorf("%w: fd %d is a pseudo-terminal master (%s) of a kind restore cannot rebuild (a legacy BSD pty, or a kernel that does not show its pair's number)", image.ErrUnsupported, f.Num, f.Path)
	}
	if err := d.Outside(f, &out); err != nil {
		return out, err
	}
	out.Kind = image.FDChr
	out.Path = f.Path
	out.Rdev = f.Stat.Rdev
	if tio, err := readTermios(d.PID, f.Num); err != nil {
		d.Log.Warn("terminal settings not read: restore --shell-job leaves its terminal's as they are", "pid", d.PID, "fd", f.Num, "err", err)
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
