package tty

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
)

// Pseudo-terminal pairs whose master the processes hold (a terminal
// multiplexer, sshd, a supervisor running a job on a pty, expect). The
// dump records each end (image.Pty) and, with one master descriptor, the
// terminal's settings, window size and the bytes queued each way: read
// out through a descriptor of our own on each end (the slave's by
// TIOCGPTPEER on the master, never by its name), the line being typed
// with them (read with the slave made raw for the time of it), then
// written back as they were, so that a process left running finds them.
// Restore makes a new pair in snapctl (/dev/ptmx, TIOCGPTPEER), fills its
// queues the same way, gives it the settings and size, and hands each
// process its ends: the master as it was, each slave a new open of the
// new slave with its flags. A session leader whose controlling terminal
// was the slave makes the new slave its controlling terminal, with the
// same foreground group (CTTY). A pair whose slave a process outside
// holds too, one in packet mode, or still locked, is refused; so is a
// master of the legacy BSD ptys.

// ptmxRdev is /dev/ptmx's device number (5:2), a master's.
var ptmxRdev = unix.Mkdev(5, 2)

// ptySlaveIndex returns N of the slave /dev/pts/N whose device number is
// rdev (majors 136 to 143).
func ptySlaveIndex(rdev uint64) (int, bool) {
	major, minor := unix.Major(rdev), unix.Minor(rdev)
	if major < 136 || major > 143 {
		return 0, false
	}
	return int(major-136)<<8 | int(minor), true
}

// Pairs are the pairs whose master a process holds, by index; each
// records whether its state was read.
type Pairs map[int]*bool

// Masters finds the pairs whose master one of the descriptors all of
// the processes pids holds. A pair whose slave a process outside holds
// too is refused: that process would keep the old pair, the restored ones
// a new one.
func Masters(pids []int, all ...[]proc.FD) (Pairs, error) {
	out := Pairs{}
	for _, fds := range all {
		for _, f := range fds {
			if f.Kind == proc.FDCharDev && f.Stat.Rdev == ptmxRdev && f.Info != nil && f.Info.TTYIndex >= 0 {
				out[f.Info.TTYIndex] = new(bool)
			}
		}
	}
	if len(out) == 0 {
		return out, nil
	}
	in := map[int]bool{os.Getpid(): true}
	for _, p := range pids {
		in[p] = true
	}
	for idx := range out {
		if pid, comm := slaveHolder(idx, in); pid != 0 {
			return nil, fmt.Errorf("%w: the slave of pseudo-terminal %d (/dev/pts/%d) is held by pid %d (%s), outside the processes dumped: dump the tree it belongs to, or stop it",
				image.ErrUnsupported, idx, idx, pid, comm)
		}
	}
	return out, nil
}

// slaveHolder returns a process not in skip that holds a descriptor on
// the slave of pair idx, and its name; 0 if none.
func slaveHolder(idx int, skip map[int]bool) (int, string) {
	rdev := unix.Mkdev(uint32(136+idx>>8), uint32(idx&0xff))
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, ""
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || skip[pid] {
			continue
		}
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue // gone, or a kernel thread
		}
		for _, fd := range fds {
			var st unix.Stat_t
			if unix.Stat(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == rdev {
				comm, _ := proc.ReadComm(pid)
				return pid, comm
			}
		}
	}
	return 0, ""
}

// withSlave returns the pair whose slave is device rdev, if the processes
// hold its master: a controlling terminal that is one.
func (p Pairs) withSlave(rdev uint64) (int, bool) {
	i, ok := ptySlaveIndex(rdev)
	return i, ok && p[i] != nil
}

// pty records f, an end of pair idx, whose master the processes hold;
// the first master descriptor of the pair gets its state.
func (d *Dumper) pty(f *proc.FD, out image.FD, idx int, master bool) (image.FD, error) {
	out.Kind = image.FDChr
	out.Path = f.Path
	out.Rdev = f.Stat.Rdev
	out.Pty = &image.Pty{Index: idx, Master: master}
	if read := d.Pairs[idx]; master && !*read {
		st, err := readPty(d.PIDFD, f.Num)
		if err != nil {
			return out, fmt.Errorf("pseudo-terminal %d (fd %d): %w", idx, f.Num, err)
		}
		out.Pty.State, *read = st, true
		d.Log.Info("pseudo-terminal pair kept", "pid", d.PID, "fd", f.Num, "pty", idx, "input", len(st.Input), "output", len(st.Output))
	}
	return out, nil
}

// readPty reads the state of the pair whose master is descriptor num of
// the process (pidfd), and leaves it as it was.
func readPty(pidfd, num int) (*image.PtyState, error) {
	m, err := unix.PidfdGetfd(pidfd, num, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_getfd: %w", err)
	}
	defer unix.Close(m)
	if pkt, err := unix.IoctlGetInt(m, unix.TIOCGPKT); err != nil || pkt != 0 {
		return nil, fmt.Errorf("%w: its master is in packet mode (TIOCPKT), which restore does not set", image.ErrUnsupported)
	}
	if locked, err := unix.IoctlGetInt(m, unix.TIOCGPTLCK); err != nil || locked != 0 {
		return nil, fmt.Errorf("%w: its slave is still locked (unlockpt was not called)", image.ErrUnsupported)
	}
	s, err := ptyPeer(m)
	if err != nil {
		return nil, err
	}
	defer unix.Close(s)
	tio, err := unix.IoctlGetTermios(s, unix.TCGETS)
	if err != nil {
		return nil, fmt.Errorf("TCGETS: %w", err)
	}
	ws, err := unix.IoctlGetWinsize(s, unix.TIOCGWINSZ)
	if err != nil {
		return nil, fmt.Errorf("TIOCGWINSZ: %w", err)
	}
	st := &image.PtyState{Termios: termiosImage(tio), Winsize: image.Winsize{Row: ws.Row, Col: ws.Col, Xpixel: ws.Xpixel, Ypixel: ws.Ypixel}}
	// Raw for a moment, the line being typed reads with the rest.
	raw := *tio
	raw.Lflag &^= unix.ICANON | unix.ECHO | unix.ECHONL | unix.ISIG | unix.IEXTEN
	raw.Cc[unix.VMIN], raw.Cc[unix.VTIME] = 0, 0
	if err := unix.IoctlSetTermios(s, unix.TCSETS, &raw); err != nil {
		return nil, fmt.Errorf("TCSETS: %w", err)
	}
	if st.Input, err = readAvailable(s); err == nil {
		st.Output, err = readAvailable(m)
	}
	// As it was, whatever happened: queues and settings.
	if werr := fillPty(m, s, tio, st.Input, st.Output); err == nil {
		err = werr
	}
	if err != nil {
		return nil, err
	}
	return st, nil
}

// ptyPeer opens the slave of master m (TIOCGPTPEER: by the master, not
// by a name another mount namespace could give another pair),
// non-blocking and not as a controlling terminal.
func ptyPeer(m int) (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(m), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_NONBLOCK|unix.O_CLOEXEC)
	if errno != 0 {
		return -1, fmt.Errorf("TIOCGPTPEER: %w", errno)
	}
	return int(r), nil
}

// readAvailable reads what fd has to read now (FIONREAD says how much).
func readAvailable(fd int) ([]byte, error) {
	n, err := unix.IoctlGetInt(fd, unix.TIOCINQ) // FIONREAD
	if err != nil || n <= 0 {
		return nil, err
	}
	b := make([]byte, n)
	got := 0
	for got < n {
		k, err := unix.Read(fd, b[got:])
		if errors.Is(err, unix.EAGAIN) || k == 0 {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read queued bytes: %w", err)
		}
		got += k
	}
	return b[:got], nil
}

// fillPty queues input (for the slave's reader) and output (for the
// master's reader, written to slave s) as they were read, then gives the
// terminal settings tio. Meanwhile the slave echoes nothing, translates
// nothing and takes no character as a signal or an edit; in canonical
// mode the input forms the same lines again. The input goes in with
// TIOCSTI, which the line discipline takes at once, under those
// settings: written to master m it would be taken later, by a kernel
// worker, perhaps under tio, echoing it.
func fillPty(m, s int, tio *unix.Termios, input, output []byte) error {
	w := *tio
	w.Lflag &^= unix.ECHO | unix.ECHOE | unix.ECHOK | unix.ECHONL | unix.ECHOCTL | unix.ECHOKE | unix.ISIG | unix.IEXTEN
	w.Iflag &^= unix.ICRNL | unix.INLCR | unix.IGNCR | unix.IUCLC | unix.IXON | unix.IXOFF
	w.Oflag &^= unix.OPOST
	for _, c := range []int{unix.VERASE, unix.VKILL, unix.VWERASE, unix.VREPRINT, unix.VEOF, unix.VLNEXT} {
		w.Cc[c] = 0 // _POSIX_VDISABLE
	}
	if err := unix.IoctlSetTermios(s, unix.TCSETS, &w); err != nil {
		return fmt.Errorf("TCSETS: %w", err)
	}
	for i := range input {
		c := input[i]
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(s), unix.TIOCSTI, uintptr(unsafe.Pointer(&c))); e != 0 {
			return fmt.Errorf("queue %d bytes of input again: TIOCSTI: %w", len(input), e)
		}
	}
	for b := output; len(b) > 0; {
		n, err := unix.Write(s, b)
		if err != nil {
			return fmt.Errorf("queue %d bytes of output again: %w", len(output), err)
		}
		b = b[n:]
	}
	if err := unix.IoctlSetTermios(s, unix.TCSETS, tio); err != nil {
		return fmt.Errorf("TCSETS: %w", err)
	}
	return nil
}

func termiosImage(t *unix.Termios) image.Termios {
	return image.Termios{Iflag: t.Iflag, Oflag: t.Oflag, Cflag: t.Cflag, Lflag: t.Lflag, Line: t.Line, Cc: t.Cc, Ispeed: t.Ispeed, Ospeed: t.Ospeed}
}

func termiosOf(t *image.Termios) *unix.Termios {
	return &unix.Termios{Iflag: t.Iflag, Oflag: t.Oflag, Cflag: t.Cflag, Lflag: t.Lflag, Line: t.Line, Cc: t.Cc, Ispeed: t.Ispeed, Ospeed: t.Ospeed}
}

// Taker hands out, during the restore of a tree, the objects its
// processes share (fds.Tree, whose method this is).
type Taker interface {
	// Take puts into the process that in injects into a descriptor on
	// the object key and returns its number there (close-on-exec); ok
	// is false if no process has handed the object out yet.
	Take(in *syscalls.Injector, key string) (fd int, ok bool, err error)
}

// PtyKey names an end of pseudo-terminal pair index.
func PtyKey(index int, master bool) string {
	if master {
		return fmt.Sprintf("pty:%d:m", index)
	}
	return fmt.Sprintf("pty:%d:s", index)
}

// MakePairs makes, in snapctl, a new pair for each pair of the processes
// sts, with its state, and returns both ends of each by PtyKey.
func MakePairs(sts []*image.Process, out map[string]int) error {
	for _, st := range sts {
		for _, f := range st.FDs {
			pt := f.Pty
			if pt == nil || pt.State == nil {
				continue
			}
			if _, ok := out[PtyKey(pt.Index, true)]; ok {
				continue
			}
			m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("pseudo-terminal %d: open /dev/ptmx: %w", pt.Index, err)
			}
			out[PtyKey(pt.Index, true)] = m
			if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
				return fmt.Errorf("pseudo-terminal %d: unlockpt: %w", pt.Index, err)
			}
			s, err := ptyPeer(m)
			if err != nil {
				return fmt.Errorf("pseudo-terminal %d: %w", pt.Index, err)
			}
			out[PtyKey(pt.Index, false)] = s
			ps := pt.State
			if err := fillPty(m, s, termiosOf(&ps.Termios), ps.Input, ps.Output); err != nil {
				return fmt.Errorf("pseudo-terminal %d: %w", pt.Index, err)
			}
			ws := unix.Winsize{Row: ps.Winsize.Row, Col: ps.Winsize.Col, Xpixel: ps.Winsize.Xpixel, Ypixel: ps.Winsize.Ypixel}
			if err := unix.IoctlSetWinsize(m, unix.TIOCSWINSZ, &ws); err != nil {
				return fmt.Errorf("pseudo-terminal %d: TIOCSWINSZ: %w", pt.Index, err)
			}
		}
	}
	return nil
}

// SetCTTY makes the slave of pair c the controlling terminal of the
// session leader in injects into (st), with fg (a process group of the
// session, in its pid namespace) in the foreground. The leader holds a
// descriptor on it, or gets one from t for the time of the call.
func SetCTTY(in *syscalls.Injector, st *image.Process, c *image.CTTY, fg int, t Taker) error {
	fd := -1
	for _, f := range st.FDs {
		if f.Pty != nil && !f.Pty.Master && f.Pty.Index == c.Pty {
			fd = f.FD
			break
		}
	}
	if fd < 0 {
		got, ok, err := t.Take(in, PtyKey(c.Pty, false))
		if err != nil {
			return fmt.Errorf("controlling terminal: pseudo-terminal %d: %w", c.Pty, err)
		}
		if !ok {
			return fmt.Errorf("%w: controlling terminal: pseudo-terminal %d has no master in the snapshot", image.ErrCorrupt, c.Pty)
		}
		defer in.CloseFD(got)
		fd = got
	}
	if _, err := in.Call(unix.SYS_IOCTL, uint64(fd), unix.TIOCSCTTY, 0); err != nil {
		return fmt.Errorf("controlling terminal: TIOCSCTTY on pseudo-terminal %d: %w", c.Pty, err)
	}
	at, err := in.Put(0, []byte{byte(fg), byte(fg >> 8), byte(fg >> 16), byte(fg >> 24)})
	if err != nil {
		return err
	}
	if _, err := in.Call(unix.SYS_IOCTL, uint64(fd), unix.TIOCSPGRP, at); err != nil {
		return fmt.Errorf("controlling terminal: TIOCSPGRP %d on pseudo-terminal %d: %w", fg, c.Pty, err)
	}
	return nil
}

// CTTYOf returns the pair of the processes sts whose slave is device
// ttyNr (a controlling terminal, as /proc/PID/stat gives it), if they hold
// its master.
func CTTYOf(ttyNr uint64, sts []*image.Process) (int, bool) {
	i, ok := ptySlaveIndex(ttyNr)
	if !ok {
		return 0, false
	}
	for _, st := range sts {
		for _, f := range st.FDs {
			if f.Pty != nil && f.Pty.Master && f.Pty.Index == i {
				return i, true
			}
		}
	}
	return 0, false
}
