package fds

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
)

func dumpEventfd(f *proc.FD, out image.FD) (image.FD, error) {
	e := f.Info.Eventfd
	if e == nil {
		return out, fmt.Errorf("eventfd without eventfd-count in fdinfo")
	}
	out.Kind = image.FDEventfd
	out.Eventfd = &image.Eventfd{Count: e.Count, Semaphore: e.Semaphore}
	return out, nil
}

// epoll records an epoll instance's targets, each of which must still be
// open under the number it was added with.
func (fx *fdDumper) epoll(f *proc.FD, out image.FD) (image.FD, error) {
	out.Kind = image.FDEpoll
	out.Epoll = &image.Epoll{Targets: []image.EpollTarget{}}
	for _, t := range f.Info.Epoll {
		if !fx.open(t.TFD, t.Ino) {
			return out, fmt.Errorf("%w: epoll watches fd %d (inode %d), which is no longer open under that number", image.ErrUnsupported, t.TFD, t.Ino)
		}
		out.Epoll.Targets = append(out.Epoll.Targets, image.EpollTarget{FD: t.TFD, Events: t.Events, Data: t.Data})
	}
	return out, nil
}

func dumpTimerfd(f *proc.FD, out image.FD) (image.FD, error) {
	t := f.Info.Timerfd
	if t == nil {
		return out, fmt.Errorf("timerfd without clockid in fdinfo")
	}
	out.Kind = image.FDTimerfd
	out.Timerfd = &image.Timerfd{Clock: t.ClockID, Flags: t.SettimeFlags, Ticks: t.Ticks,
		ValueNs: int64(t.Value.Sec*1e9 + t.Value.Nsec), IntervalNs: int64(t.Interval.Sec*1e9 + t.Interval.Nsec)}
	return out, nil
}

func dumpSignalfd(f *proc.FD, out image.FD) (image.FD, error) {
	if f.Info.Signalfd == nil {
		return out, fmt.Errorf("signalfd without sigmask in fdinfo")
	}
	out.Kind = image.FDSignalfd
	out.Signalfd = &image.Signalfd{Mask: f.Info.Signalfd.Mask}
	return out, nil
}

// epollTargets registers every epoll instance's targets, all in place.
func (fc *fdCreator) epollTargets() error {
	for _, f := range fc.st.FDs {
		if f.Epoll == nil {
			continue
		}
		for _, t := range f.Epoll.Targets {
			at, err := fc.in.Put(0, epollEvent(t.Events, t.Data))
			if err != nil {
				return err
			}
			if _, err := fc.in.Call(unix.SYS_EPOLL_CTL, uint64(f.FD), unix.EPOLL_CTL_ADD, uint64(t.FD), at); err != nil {
				return fmt.Errorf("fd %d: epoll_ctl(ADD, %d, %#x): %w", f.FD, t.FD, t.Events, err)
			}
		}
	}
	return nil
}

// tfdIocSetTicks is TFD_IOC_SET_TICKS, _IOW('T', 0, u64).
const tfdIocSetTicks = 0x40085400

func (fc *fdCreator) timerfd(f *image.FD, flags uint64) (int, error) {
	t := f.Timerfd
	fd, err := fc.in.Call(unix.SYS_TIMERFD_CREATE, uint64(t.Clock), flags)
	if err != nil {
		return -1, fmt.Errorf("timerfd_create(%d): %w", t.Clock, err)
	}
	value := t.ValueNs
	if value <= 0 && t.IntervalNs != 0 {
		// A periodic timer that expired and was not read since is not
		// re-armed until it is (fdinfo shows no time remaining): it
		// fires again at once, and its pending ticks are set below.
		value = 1
	}
	settime := uint64(0)
	if value > 0 && t.Flags&unix.TFD_TIMER_ABSTIME != 0 {
		// fdinfo gives the time remaining even for an absolute timer:
		// it expires that long from now on its clock, and keeps its
		// flags (TFD_TIMER_CANCEL_ON_SET with them).
		var now unix.Timespec
		if err := unix.ClockGettime(int32(t.Clock), &now); err != nil {
			return -1, fmt.Errorf("clock_gettime(%d): %w", t.Clock, err)
		}
		value += now.Nano()
		settime = uint64(t.Flags & (unix.TFD_TIMER_ABSTIME | unix.TFD_TIMER_CANCEL_ON_SET))
	}
	if value > 0 {
		// fdinfo gives the time remaining: set it relative (or
		// absolute, above).
		its := make([]byte, 32)
		le := binary.LittleEndian
		le.PutUint64(its[0:], uint64(t.IntervalNs/1e9))
		le.PutUint64(its[8:], uint64(t.IntervalNs%1e9))
		le.PutUint64(its[16:], uint64(value/1e9))
		le.PutUint64(its[24:], uint64(value%1e9))
		at, err := fc.in.Put(0, its)
		if err != nil {
			return -1, err
		}
		if _, err := fc.in.Call(unix.SYS_TIMERFD_SETTIME, fd, settime, at, 0); err != nil {
			return -1, fmt.Errorf("timerfd_settime: %w", err)
		}
	}
	if t.Ticks > 0 {
		at, err := fc.in.Put(0, binary.LittleEndian.AppendUint64(nil, t.Ticks))
		if err != nil {
			return -1, err
		}
		if _, err := fc.in.Call(unix.SYS_IOCTL, fd, tfdIocSetTicks, at); err != nil {
			return -1, fmt.Errorf("timerfd: set %d pending ticks: %w", t.Ticks, err)
		}
	}
	return int(fd), nil
}

// eventfd creates an eventfd with its count.
func (fc *fdCreator) eventfd(f *image.FD, flags uint64) (int, error) {
	if f.Eventfd.Semaphore {
		flags |= unix.EFD_SEMAPHORE
	}
	fd, err := fc.in.Call(unix.SYS_EVENTFD2, 0, flags)
	if err != nil {
		return -1, fmt.Errorf("eventfd2: %w", err)
	}
	if c := f.Eventfd.Count; c > 0 {
		if err := fc.write(int(fd), binary.LittleEndian.AppendUint64(nil, c)); err != nil {
			return -1, fmt.Errorf("eventfd count %d: %w", c, err)
		}
	}
	return int(fd), nil
}

// epoll creates an epoll instance; its targets are registered once every
// descriptor is in place (epollTargets).
func (fc *fdCreator) epoll(f *image.FD, nonblock, cloexec uint64) (int, error) {
	fd, err := fc.in.Call(unix.SYS_EPOLL_CREATE1, cloexec)
	if err != nil {
		return -1, fmt.Errorf("epoll_create1: %w", err)
	}
	if nonblock != 0 {
		if err := fc.SetFlags(int(fd), f); err != nil {
			return -1, err
		}
	}
	return int(fd), nil
}

// signalfd creates a signalfd with its mask.
func (fc *fdCreator) signalfd(f *image.FD, flags uint64) (int, error) {
	at, err := fc.in.Put(0, binary.LittleEndian.AppendUint64(nil, f.Signalfd.Mask))
	if err != nil {
		return -1, err
	}
	fd, err := fc.in.Call(unix.SYS_SIGNALFD4, ^uint64(0), at, 8, flags)
	if err != nil {
		return -1, fmt.Errorf("signalfd4: %w", err)
	}
	return int(fd), nil
}
