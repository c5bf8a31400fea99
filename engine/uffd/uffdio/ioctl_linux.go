package uffdio

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PageSize is the base page size on x86-64; every range handed to the
// ioctls must be aligned to it.
const PageSize = 4096

// apiVersion is UFFD_API.
const apiVersion = 0xAA

// Feature bits of UFFDIO_API (include/uapi/linux/userfaultfd.h).
const (
	FeaturePagefaultFlagWP   = 1 << 0
	FeatureEventFork         = 1 << 1
	FeatureEventRemap        = 1 << 2
	FeatureEventRemove       = 1 << 3
	FeatureMissingHugetlbfs  = 1 << 4
	FeatureMissingShmem      = 1 << 5
	FeatureEventUnmap        = 1 << 6
	FeatureSigbus            = 1 << 7
	FeatureThreadID          = 1 << 8
	FeatureMinorHugetlbfs    = 1 << 9
	FeatureMinorShmem        = 1 << 10
	FeatureExactAddress      = 1 << 11
	FeatureWPHugetlbfsShmem  = 1 << 12
	FeatureWPUnpopulated     = 1 << 13
	FeaturePoison            = 1 << 14
	FeatureWPAsync           = 1 << 15
	FeatureMove              = 1 << 16
	featureInitializedKernel = 1 << 31 // internal bit shown in fdinfo
)

// RequiredFeatures are the event features a Pager needs: without them it
// could serve snapshot data where the process has dropped or moved memory.
const RequiredFeatures = FeatureEventFork | FeatureEventRemap | FeatureEventRemove | FeatureEventUnmap

// Features is what the restore code passes to API for a Pager: the required
// events plus the faulting thread's id in page-fault messages (for logs).
const Features = RequiredFeatures | FeatureThreadID

// Registration modes of UFFDIO_REGISTER.
const (
	RegisterModeMissing = 1 << 0
	RegisterModeWP      = 1 << 1
	RegisterModeMinor   = 1 << 2
)

// Ioctl bits as returned by API (for the fd) and Register (for the range).
const (
	IoctlRegister     = 1 << 0x00
	IoctlUnregister   = 1 << 0x01
	IoctlWake         = 1 << 0x02
	IoctlCopy         = 1 << 0x03
	IoctlZeroPage     = 1 << 0x04
	IoctlWriteProtect = 1 << 0x06
	IoctlContinue     = 1 << 0x07
	IoctlAPI          = 1 << 0x3F
)

// Mode bits of Copy and ZeroPage.
const (
	CopyModeDontWake     = 1 << 0
	CopyModeWP           = 1 << 1
	ZeroPageModeDontWake = 1 << 0
)

// Ioctl request numbers: _IOWR/_IOR(0xAA, nr, size) on x86-64 (checked
// against the C header in the tests' comments: API 0xc018aa3f, ...).
const (
	reqAPI        = 0xc018aa3f
	reqRegister   = 0xc020aa00
	reqUnregister = 0x8010aa01
	reqWake       = 0x8010aa02
	reqCopy       = 0xc028aa03
	reqZeroPage   = 0xc020aa04
)

type uffdioAPI struct {
	API      uint64
	Features uint64
	Ioctls   uint64
}

type uffdioRange struct {
	Start uint64
	Len   uint64
}

type uffdioRegister struct {
	Range  uffdioRange
	Mode   uint64
	Ioctls uint64
}

type uffdioCopy struct {
	Dst  uint64
	Src  uint64
	Len  uint64
	Mode uint64
	Copy int64
}

type uffdioZeroPage struct {
	Range    uffdioRange
	Mode     uint64
	Zeropage int64
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) unix.Errno {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	return e
}

// API enables features on a new userfaultfd (UFFDIO_API, allowed once per
// fd). It returns every feature the kernel supports and the ioctls
// available on the fd. Asking for an unsupported feature is EINVAL.
func API(fd int, features uint64) (supported, ioctls uint64, err error) {
	a := uffdioAPI{API: apiVersion, Features: features}
	if e := ioctl(fd, reqAPI, unsafe.Pointer(&a)); e != 0 {
		return 0, 0, fmt.Errorf("UFFDIO_API features %#x: %w", features, e)
	}
	return a.Features, a.Ioctls, nil
}

// Register registers [start, start+length) with mode (RegisterModeMissing,
// ...) and returns the ioctls allowed on the range. The range must be page
// aligned and cover whole VMAs or parts of them that support the mode.
func Register(fd int, start, length, mode uint64) (ioctls uint64, err error) {
	r := uffdioRegister{Range: uffdioRange{start, length}, Mode: mode}
	if e := ioctl(fd, reqRegister, unsafe.Pointer(&r)); e != 0 {
		return 0, fmt.Errorf("UFFDIO_REGISTER %#x+%#x mode %#x: %w", start, length, mode, e)
	}
	return r.Ioctls, nil
}

// Unregister removes the registration of [start, start+length) and wakes
// any thread blocked on a fault there (it retries without userfaultfd).
func Unregister(fd int, start, length uint64) error {
	r := uffdioRange{start, length}
	if e := ioctl(fd, reqUnregister, unsafe.Pointer(&r)); e != 0 {
		return fmt.Errorf("UFFDIO_UNREGISTER %#x+%#x: %w", start, length, e)
	}
	return nil
}

// Wake wakes the threads blocked on faults in [start, start+length).
func Wake(fd int, start, length uint64) error {
	r := uffdioRange{start, length}
	if e := ioctl(fd, reqWake, unsafe.Pointer(&r)); e != 0 {
		return fmt.Errorf("UFFDIO_WAKE %#x+%#x: %w", start, length, e)
	}
	return nil
}

// Copy atomically places src (a whole number of pages) at dst in the
// registered process (UFFDIO_COPY) and, unless mode has CopyModeDontWake,
// wakes the threads waiting there. It returns the bytes placed:
//
//	len(src), nil   all placed
//	n, ErrShort     the first n bytes placed; the kernel stopped at dst+n,
//	                call again for the rest to learn why
//	0, ErrExist     the page at dst is already present
//	0, ErrAgain     the address space is changing (an event is queued and
//	                unread): read the events, then retry
//	0, ErrNoVMA     no registered VMA holds all of [dst, dst+len(src))
//	0, ErrGone      the process's address space is gone (it exited)
//	0, other        wrapped errno (EINVAL, EFAULT, ENOMEM, ...)
func Copy(fd int, dst uint64, src []byte, mode uint64) (copied int64, err error) {
	if len(src) == 0 {
		return 0, nil
	}
	c := uffdioCopy{Dst: dst, Src: uint64(uintptr(unsafe.Pointer(&src[0]))), Len: uint64(len(src)), Mode: mode}
	var e unix.Errno
	for {
		e = ioctl(fd, reqCopy, unsafe.Pointer(&c))
		if e != unix.EINTR || c.Copy > 0 {
			break
		}
		c.Copy = 0
	}
	runtime.KeepAlive(src)
	return fillResult("UFFDIO_COPY", dst, uint64(len(src)), c.Copy, e)
}

// ZeroPage maps the zero page on [start, start+length) (UFFDIO_ZEROPAGE);
// results as for Copy. A later write costs a copy-on-write fault.
func ZeroPage(fd int, start, length, mode uint64) (zeroed int64, err error) {
	if length == 0 {
		return 0, nil
	}
	z := uffdioZeroPage{Range: uffdioRange{start, length}, Mode: mode}
	var e unix.Errno
	for {
		e = ioctl(fd, reqZeroPage, unsafe.Pointer(&z))
		if e != unix.EINTR || z.Zeropage > 0 {
			break
		}
		z.Zeropage = 0
	}
	return fillResult("UFFDIO_ZEROPAGE", start, length, z.Zeropage, e)
}

// fillResult maps the (errno, count) pair of UFFDIO_COPY/ZEROPAGE. When
// pages were placed before a failure the kernel returns EAGAIN with the
// count; when none were, the count holds -errno.
func fillResult(op string, dst, length uint64, n int64, e unix.Errno) (int64, error) {
	if e == 0 {
		return int64(length), nil
	}
	if n > 0 {
		return n, ErrShort
	}
	switch e {
	case unix.EEXIST:
		return 0, ErrExist
	case unix.EAGAIN:
		return 0, ErrAgain
	case unix.ENOENT:
		return 0, ErrNoVMA
	case unix.ESRCH:
		return 0, ErrGone
	}
	return 0, fmt.Errorf("%s %#x+%#x: %w", op, dst, length, e)
}

// ReadMsgs reads the pending messages into buf (a multiple of MsgSize
// bytes) without blocking on an O_NONBLOCK userfaultfd and returns how many
// it read: 0 when none is pending. A FORK message installs the child's
// userfaultfd in this process's fd table; the caller owns it.
func ReadMsgs(fd int, buf []byte) (int, error) {
	for {
		n, err := unix.Read(fd, buf)
		switch {
		case err == nil:
			return n / MsgSize, nil
		case errors.Is(err, unix.EAGAIN):
			return 0, nil
		case errors.Is(err, unix.EINTR):
			continue
		}
		return 0, fmt.Errorf("read userfaultfd: %w", err)
	}
}
