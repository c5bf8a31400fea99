package fds

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

// File locks: flock(2) locks and OFD locks belong to an open file
// description, POSIX (fcntl) locks to a process and a file. The dump reads
// them from the descriptor's fdinfo ("lock:" lines, which show the locks
// held through that open file: its own flock and OFD locks, and the
// process's POSIX locks on its file); the restore takes them again on the
// restored descriptor, once every descriptor is in place. A lock someone
// else holds now refuses the restore, naming the file: the process would
// otherwise run believing it holds it. Leases and delegations are refused
// at dump.

// parseLocks turns fdinfo's "lock:" lines (without the prefix) into
// locks. A line reads: "ID: KIND MODE ACCESS PID MAJ:MIN:INO START END",
// END being EOF for a lock to the end of the file.
func parseLocks(lines []string) ([]image.Lock, error) {
	var out []image.Lock
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("fdinfo lock %q: too few fields", line)
		}
		var l image.Lock
		switch f[1] {
		case "FLOCK":
			l.Kind = image.LockFlock
		case "POSIX":
			l.Kind = image.LockPOSIX
		case "OFDLCK":
			l.Kind = image.LockOFD
		default:
			// LEASE, DELEG, BREAKING...: the kernel breaks those for
			// whoever opens the file; restore cannot take them back.
			return nil, fmt.Errorf("%w: a %s on the file (%s), which restore cannot take again", image.ErrUnsupported, strings.ToLower(f[1]), line)
		}
		if f[2] != "ADVISORY" {
			return nil, fmt.Errorf("%w: a %s %s lock (%s)", image.ErrUnsupported, strings.ToLower(f[2]), f[1], line)
		}
		switch f[3] {
		case "WRITE":
			l.Write = true
		case "READ":
		default:
			return nil, fmt.Errorf("fdinfo lock %q: access %q", line, f[3])
		}
		var err error
		if l.Start, err = strconv.ParseInt(f[6], 10, 64); err != nil || l.Start < 0 {
			return nil, fmt.Errorf("fdinfo lock %q: start %q", line, f[6])
		}
		l.End = -1
		if f[7] != "EOF" {
			if l.End, err = strconv.ParseInt(f[7], 10, 64); err != nil || l.End < l.Start {
				return nil, fmt.Errorf("fdinfo lock %q: end %q", line, f[7])
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// takeLocks takes again, in the process, the locks of every descriptor
// that has its own open file description (a dup's are its original's).
func (fc *fdCreator) takeLocks() error {
	for _, f := range fc.st.FDs {
		if f.SameAs != nil {
			continue
		}
		for _, l := range f.Locks {
			if err := fc.takeLock(f.FD, l); err != nil {
				name := f.Path
				if name == "" {
					name = f.Kind
				}
				return fmt.Errorf("%w: fd %d (%s): %s %s lock on bytes %d-%s: %w", ErrLockHeld, f.FD, name, lockAccess(l), l.Kind, l.Start, lockEnd(l), err)
			}
		}
	}
	return nil
}

// ErrLockHeld: a file lock the process held at the dump is held by
// another process now, and the restore cannot take it again.
var ErrLockHeld = fmt.Errorf("%w: file lock held by another process", ErrFileChanged)

// takeLock takes lock l on fd in the process, without waiting.
func (fc *fdCreator) takeLock(fd int, l image.Lock) error {
	if l.Kind == image.LockFlock {
		op := unix.LOCK_SH
		if l.Write {
			op = unix.LOCK_EX
		}
		_, err := fc.in.Call(unix.SYS_FLOCK, uint64(fd), uint64(op|unix.LOCK_NB))
		return err
	}
	// struct flock: l_type, l_whence (shorts), l_start, l_len, l_pid.
	var b [32]byte
	typ := uint16(unix.F_RDLCK)
	if l.Write {
		typ = unix.F_WRLCK
	}
	binary.LittleEndian.PutUint16(b[0:], typ)
	binary.LittleEndian.PutUint16(b[2:], 0) // SEEK_SET
	binary.LittleEndian.PutUint64(b[8:], uint64(l.Start))
	length := int64(0) // to the end of the file
	if l.End >= 0 {
		length = l.End - l.Start + 1
	}
	binary.LittleEndian.PutUint64(b[16:], uint64(length))
	at, err := fc.in.Put(0, b[:])
	if err != nil {
		return err
	}
	cmd := unix.F_SETLK
	if l.Kind == image.LockOFD {
		cmd = unix.F_OFD_SETLK
	}
	_, err = fc.in.Call(unix.SYS_FCNTL, uint64(fd), uint64(cmd), at)
	return err
}

func lockAccess(l image.Lock) string {
	if l.Write {
		return "a write"
	}
	return "a read"
}

func lockEnd(l image.Lock) string {
	if l.End < 0 {
		return "EOF"
	}
	return strconv.FormatInt(l.End, 10)
}
