package proc

import (
	"bytes"
	"fmt"
)

// Bounds on fdinfo contents.
const (
	maxEpollTargets = 1 << 20
	maxInotify      = 1 << 20
	maxExtraLines   = 1 << 16
)

// FDInfo is /proc/PID/fdinfo/N: the common header and the lines of the
// file's kind. Lines this package does not parse are kept in Extra.
type FDInfo struct {
	Pos   int64
	Flags uint32 // open flags, octal in the file; O_CLOEXEC (02000000) shows here
	MntID int
	Ino   uint64

	Eventfd  *EventfdInfo
	Epoll    []EpollTarget // one per watched fd, in the kernel's order
	Timerfd  *TimerfdInfo
	Signalfd *SignalfdInfo
	Inotify  []InotifyWatch
	Pidfd    *PidfdInfo
	Uffd     *UffdInfo
	// Locks are the "lock:" lines of file locks held through this file.
	Locks []string
	// TTYIndex is a pseudo-terminal master's pair number ("tty-index":
	// its slave is /dev/pts/TTYIndex); -1 for any other file.
	TTYIndex int
	// Extra holds every other line (fanotify, tun, ...).
	Extra []string
}

// EventfdInfo is the state of an eventfd.
type EventfdInfo struct {
	Count     uint64 // hex in the file
	Semaphore bool
	ID        int
}

// EpollTarget is one fd watched by an epoll instance.
type EpollTarget struct {
	TFD    int    // the watched fd number in the process
	Events uint32 // EPOLL* mask, including EPOLLET and EPOLLONESHOT
	Data   uint64 // the user's epoll_data
	Pos    int64  // file position of the target
	Ino    uint64 // inode of the target file
	Sdev   uint32 // device of the target file (kernel-internal encoding)
}

// Timespec is a time in seconds and nanoseconds.
type Timespec struct {
	Sec, Nsec uint64
}

// TimerfdInfo is the state of a timerfd.
type TimerfdInfo struct {
	ClockID      int
	Ticks        uint64 // expirations not yet read
	SettimeFlags int    // TFD_TIMER_ABSTIME, TFD_TIMER_CANCEL_ON_SET
	// Value is the time until the next expiry (relative, even for an
	// absolute timer); Interval is the period, zero for one-shot.
	Value, Interval Timespec
}

// SignalfdInfo is the state of a signalfd.
type SignalfdInfo struct {
	Mask uint64 // the signals the fd accepts (bit n-1 for signal n)
}

// InotifyWatch is one inotify watch.
type InotifyWatch struct {
	WD          int
	Ino         uint64
	Sdev        uint32
	Mask        uint32
	IgnoredMask uint32
	// FHandle is the file handle of the watched inode (hex in the
	// file), when the kernel could encode one.
	FHandleType int
	FHandle     []byte
}

// PidfdInfo is the process a pidfd refers to.
type PidfdInfo struct {
	Pid   int   // -1 when the process has been reaped
	NSpid []int // pid in each nested namespace
}

// UffdInfo is the state of a userfaultfd.
type UffdInfo struct {
	Pending uint64 // faults reported and not yet resolved
	Total   uint64 // faults reported since it was opened
	// API is UFFD_API, Features those UFFDIO_API enabled (0 before it was
	// called), Ioctls the ioctls it accepts: the "API:" line, in hex.
	API, Features, Ioctls uint64
}

// ParseFDInfo parses /proc/PID/fdinfo/N.
func ParseFDInfo(b []byte) (*FDInfo, error) {
	if len(b) > MaxSmallFile {
		return nil, fmt.Errorf("%w: fdinfo longer than %d bytes", ErrTooLarge, MaxSmallFile)
	}
	fi := &FDInfo{TTYIndex: -1}
	var seenPos, seenFlags bool
	var fields [][]byte
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		if len(line) == 0 {
			continue
		}
		var err error
		switch {
		case bytes.HasPrefix(line, []byte("tfd:")):
			if len(fi.Epoll) >= maxEpollTargets {
				return nil, fmt.Errorf("%w: more than %d epoll targets", ErrTooLarge, maxEpollTargets)
			}
			var t EpollTarget
			t, err = parseEpollLine(line, fields[:0])
			fi.Epoll = append(fi.Epoll, t)
		case bytes.HasPrefix(line, []byte("inotify ")):
			if len(fi.Inotify) >= maxInotify {
				return nil, fmt.Errorf("%w: more than %d inotify watches", ErrTooLarge, maxInotify)
			}
			var w InotifyWatch
			w, err = parseInotifyLine(line[len("inotify "):], fields[:0])
			fi.Inotify = append(fi.Inotify, w)
		case bytes.HasPrefix(line, []byte("lock:")):
			if len(fi.Locks)+len(fi.Extra) >= maxExtraLines {
				return nil, fmt.Errorf("%w: more than %d fdinfo lines", ErrTooLarge, maxExtraLines)
			}
			fi.Locks = append(fi.Locks, string(trimSpace(line[len("lock:"):])))
		default:
			key, val, ok := bytes.Cut(line, []byte{':'})
			if !ok {
				err = Malformed("fdinfo line", line)
				break
			}
			val = trimSpace(val)
			var handled bool
			handled, err = fi.parseField(string(key), val, line)
			switch string(key) {
			case "pos":
				seenPos = true
			case "flags":
				seenFlags = true
			}
			if !handled && err == nil {
				if len(fi.Locks)+len(fi.Extra) >= maxExtraLines {
					return nil, fmt.Errorf("%w: more than %d fdinfo lines", ErrTooLarge, maxExtraLines)
				}
				fi.Extra = append(fi.Extra, string(line))
			}
		}
		if err != nil {
			return nil, err
		}
	}
	if !seenPos || !seenFlags {
		return nil, Malformed("fdinfo without pos and flags", nil)
	}
	return fi, nil
}

// parseField parses one "key: value" line; it returns false for a key it
// does not know. The keys every descriptor has are here, those of each
// kind of descriptor in a function of its own (no two kinds share a key).
func (fi *FDInfo) parseField(key string, val, line []byte) (bool, error) {
	var ok bool
	switch key {
	case "pos":
		fi.Pos, ok = parseInt(val)
	case "flags":
		var v uint64
		v, ok = parseUint(val, 8)
		ok = ok && v <= 1<<32-1
		fi.Flags = uint32(v)
	case "mnt_id":
		fi.MntID, ok = intIn(val, -1<<31, 1<<31)
	case "ino":
		fi.Ino, ok = parseUint(val, 10)
	case "tty-index":
		fi.TTYIndex, ok = intIn(val, 0, 1<<20)
	case "eventfd-count", "eventfd-semaphore", "eventfd-id":
		ok = fi.parseEventfdField(key, val)
	case "clockid", "ticks", "settime flags", "it_value", "it_interval":
		ok = fi.parseTimerfdField(key, val)
	case "sigmask":
		fi.Signalfd = &SignalfdInfo{}
		fi.Signalfd.Mask, ok = parseUint(val, 16)
	case "Pid", "NSpid":
		ok = fi.parsePidfdField(key, val)
	case "pending", "total", "API":
		ok = fi.parseUffdField(key, val)
	default:
		return false, nil
	}
	if !ok {
		return true, Malformed("fdinfo "+key, line)
	}
	return true, nil
}

// parseEventfdField parses an eventfd's line; false means malformed.
func (fi *FDInfo) parseEventfdField(key string, val []byte) (ok bool) {
	e := fi.eventfd()
	switch key {
	case "eventfd-count":
		e.Count, ok = parseUint(val, 16)
	case "eventfd-semaphore":
		var v uint64
		v, ok = parseUint(val, 10)
		e.Semaphore = v != 0
	case "eventfd-id":
		e.ID, ok = intIn(val, -1<<31, 1<<31)
	}
	return ok
}

// parseTimerfdField parses a timerfd's line; false means malformed.
func (fi *FDInfo) parseTimerfdField(key string, val []byte) (ok bool) {
	tf := fi.timerfd()
	switch key {
	case "clockid":
		tf.ClockID, ok = intIn(val, -1<<31, 1<<31)
	case "ticks":
		tf.Ticks, ok = parseUint(val, 10)
	case "settime flags":
		var v uint64
		v, ok = parseUint(val, 8)
		ok = ok && v < 1<<31
		tf.SettimeFlags = int(v)
	case "it_value":
		tf.Value, ok = parseTimespec(val)
	case "it_interval":
		tf.Interval, ok = parseTimespec(val)
	}
	return ok
}

// parsePidfdField parses a pidfd's line; false means malformed.
func (fi *FDInfo) parsePidfdField(key string, val []byte) (ok bool) {
	if fi.Pidfd == nil {
		fi.Pidfd = &PidfdInfo{}
	}
	switch key {
	case "Pid":
		fi.Pidfd.Pid, ok = intIn(val, -1, 1<<31)
	case "NSpid":
		ps, err := ParsePidList(val)
		fi.Pidfd.NSpid, ok = ps, err == nil && len(ps) <= 64
	}
	return ok
}

// parseUffdField parses a userfaultfd's line; false means malformed.
func (fi *FDInfo) parseUffdField(key string, val []byte) (ok bool) {
	u := fi.uffd()
	switch key {
	case "pending":
		u.Pending, ok = parseUint(val, 10)
	case "total":
		u.Total, ok = parseUint(val, 10)
	case "API":
		api, rest, ok1 := bytes.Cut(val, []byte{':'})
		features, ioctls, ok2 := bytes.Cut(rest, []byte{':'})
		var ok3, ok4, ok5 bool
		u.API, ok3 = parseUint(api, 16)
		u.Features, ok4 = parseUint(features, 16)
		u.Ioctls, ok5 = parseUint(ioctls, 16)
		ok = ok1 && ok2 && ok3 && ok4 && ok5
	}
	return ok
}

// intIn parses a decimal integer in [lo, hi).
func intIn(b []byte, lo, hi int64) (int, bool) {
	v, ok := parseInt(b)
	return int(v), ok && v >= lo && v < hi
}

func (fi *FDInfo) eventfd() *EventfdInfo {
	if fi.Eventfd == nil {
		fi.Eventfd = &EventfdInfo{}
	}
	return fi.Eventfd
}

func (fi *FDInfo) uffd() *UffdInfo {
	if fi.Uffd == nil {
		fi.Uffd = &UffdInfo{}
	}
	return fi.Uffd
}

func (fi *FDInfo) timerfd() *TimerfdInfo {
	if fi.Timerfd == nil {
		fi.Timerfd = &TimerfdInfo{}
	}
	return fi.Timerfd
}

// parseTimespec parses "(sec, nsec)".
func parseTimespec(b []byte) (Timespec, bool) {
	b, ok1 := bytes.CutPrefix(b, []byte{'('})
	b, ok2 := bytes.CutSuffix(b, []byte{')'})
	sec, nsec, ok3 := bytes.Cut(b, []byte{','})
	if !ok1 || !ok2 || !ok3 {
		return Timespec{}, false
	}
	s, ok4 := parseUint(trimSpace(sec), 10)
	n, ok5 := parseUint(trimSpace(nsec), 10)
	return Timespec{Sec: s, Nsec: n}, ok4 && ok5
}

// keyValues splits "k1: v1 k2: v2 k3:v3" (values with or without a space
// after the colon) into alternating keys and values.
func keyValues(b []byte, dst [][]byte) ([][]byte, bool) {
	for {
		var f []byte
		f, b = nextField(b)
		if len(f) == 0 {
			return dst, true
		}
		k, v, ok := bytes.Cut(f, []byte{':'})
		if !ok || len(k) == 0 {
			return dst, false
		}
		if len(v) == 0 {
			v, b = nextField(b)
			if len(v) == 0 {
				return dst, false
			}
		}
		dst = append(dst, k, v)
	}
}

// parseEpollLine parses
// "tfd: %8d events: %8x data: %16llx  pos:%lli ino:%lx sdev:%x".
func parseEpollLine(line []byte, kv [][]byte) (EpollTarget, error) {
	var t EpollTarget
	kv, ok := keyValues(line, kv)
	if !ok {
		return t, Malformed("epoll target", line)
	}
	var seen int
	for i := 0; i+1 < len(kv); i += 2 {
		v := kv[i+1]
		var good bool
		switch string(kv[i]) {
		case "tfd":
			var x int64
			x, good = parseInt(v)
			good = good && x >= 0 && x < 1<<31
			t.TFD = int(x)
			seen++
		case "events":
			var x uint64
			x, good = parseUint(v, 16)
			good = good && x <= 1<<32-1
			t.Events = uint32(x)
			seen++
		case "data":
			t.Data, good = parseUint(v, 16)
		case "pos":
			t.Pos, good = parseInt(v)
		case "ino":
			t.Ino, good = parseUint(v, 16)
		case "sdev":
			var x uint64
			x, good = parseUint(v, 16)
			good = good && x <= 1<<32-1
			t.Sdev = uint32(x)
		default:
			good = true
		}
		if !good {
			return t, Malformed("epoll target", line)
		}
	}
	if seen != 2 {
		return t, Malformed("epoll target without tfd and events", line)
	}
	return t, nil
}

// parseInotifyLine parses "wd:%x ino:%lx sdev:%x mask:%x ignored_mask:%x
// [fhandle-bytes:%x fhandle-type:%x f_handle:%s]".
func parseInotifyLine(line []byte, kv [][]byte) (InotifyWatch, error) {
	var w InotifyWatch
	kv, ok := keyValues(line, kv)
	if !ok {
		return w, Malformed("inotify watch", line)
	}
	hex32 := func(b []byte) (uint32, bool) {
		x, ok := parseUint(b, 16)
		return uint32(x), ok && x <= 1<<32-1
	}
	var seenWD bool
	var handleLen uint64
	for i := 0; i+1 < len(kv); i += 2 {
		v := kv[i+1]
		var good bool
		var x uint32
		switch string(kv[i]) {
		case "wd":
			x, good = hex32(v)
			good = good && x < 1<<31
			w.WD = int(x)
			seenWD = true
		case "ino":
			w.Ino, good = parseUint(v, 16)
		case "sdev":
			w.Sdev, good = hex32(v)
		case "mask":
			w.Mask, good = hex32(v)
		case "ignored_mask":
			w.IgnoredMask, good = hex32(v)
		case "fhandle-bytes":
			handleLen, good = parseUint(v, 16)
			good = good && handleLen <= 128 // MAX_HANDLE_SZ
		case "fhandle-type":
			x, good = hex32(v)
			good = good && x < 1<<31
			w.FHandleType = int(x)
		case "f_handle":
			w.FHandle, good = decodeHex(v)
		default:
			good = true
		}
		if !good {
			return w, Malformed("inotify watch", line)
		}
	}
	if !seenWD || uint64(len(w.FHandle)) != handleLen {
		return w, Malformed("inotify watch", line)
	}
	return w, nil
}

func decodeHex(b []byte) ([]byte, bool) {
	if len(b)%2 != 0 || len(b) > 256 {
		return nil, false
	}
	out := make([]byte, len(b)/2)
	for i := range out {
		v, ok := parseUint(b[2*i:2*i+2], 16)
		if !ok {
			return nil, false
		}
		out[i] = byte(v)
	}
	return out, true
}
