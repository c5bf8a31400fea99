package pagemap

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"github.com/lazyfs/lazyfs/engine/proc"
	"golang.org/x/sys/unix"
)

// PAGEMAP_SCAN ABI (include/uapi/linux/fs.h, Linux 6.7).
type pageRegion struct {
	start, end, categories uint64
}

type pmScanArg struct {
	size, flags, start, end, walkEnd, vec, vecLen, maxPages       uint64
	categoryInverted, categoryMask, categoryAnyofMask, returnMask uint64
}

const (
	// _IOWR('f', 16, struct pm_scan_arg)
	ioctlPagemapScan = 3<<30 | uint64(unsafe.Sizeof(pmScanArg{}))<<16 | 'f'<<8 | 16

	pmScanWPMatching   = 1 << 0
	pmScanCheckWPAsync = 1 << 1
)

func pagemapScan(f *os.File, arg *pmScanArg, vec []pageRegion) (int, error) {
	var pin runtime.Pinner
	defer pin.Unpin()
	if len(vec) > 0 {
		pin.Pin(&vec[0])
		arg.vec = uint64(uintptr(unsafe.Pointer(&vec[0])))
	}
	arg.vecLen = uint64(len(vec))
	arg.size = uint64(unsafe.Sizeof(*arg))
	var n uintptr
	var errno unix.Errno
	err := withFd(f, func(fd uintptr) {
		for {
			n, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, uintptr(ioctlPagemapScan), uintptr(unsafe.Pointer(arg)))
			if errno != unix.EINTR {
				return
			}
		}
	})
	runtime.KeepAlive(vec)
	if err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// withFd runs fn with f's descriptor, keeping f open meanwhile.
func withFd(f *os.File, fn func(fd uintptr)) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(fn)
}

// probeScan reports whether PAGEMAP_SCAN works on f (an empty range).
func probeScan(f *os.File) bool {
	arg := pmScanArg{returnMask: uint64(PagePresent)}
	_, err := pagemapScan(f, &arg, make([]pageRegion, 1))
	return err == nil
}

// RunsScan answers q with the PAGEMAP_SCAN ioctl.
func (p *Pagemap) RunsScan(q Query, dst []Run) ([]Run, error) {
	if err := q.check(); err != nil {
		return dst, err
	}
	if !p.scanOK {
		return dst, fmt.Errorf("pagemap: PAGEMAP_SCAN: %w", errors.ErrUnsupported)
	}
	if c := q.categories(); c&^scanCategories != 0 {
		return dst, fmt.Errorf("pagemap scan: categories %#x: %w", uint64(c&^scanCategories), errors.ErrUnsupported)
	}
	if p.vec == nil {
		p.vec = make([]pageRegion, scanVecLen)
	}
	// The kernel selects pages with (categories ^ inverted) & mask == mask
	// and, when anyof is set, (categories ^ inverted) & anyof != 0.
	arg := pmScanArg{
		categoryInverted:  uint64(q.Exclude),
		categoryMask:      uint64(q.Require | q.Exclude),
		categoryAnyofMask: uint64(q.AnyOf),
		returnMask:        uint64(q.Return),
	}
	if q.AnyOf&q.Exclude != 0 {
		return dst, fmt.Errorf("pagemap scan: a category both excluded and in AnyOf: %w", errors.ErrUnsupported)
	}
	if q.WriteProtect {
		arg.flags = pmScanWPMatching | pmScanCheckWPAsync
	}
	for start := q.Start; start < q.End; {
		arg.start, arg.end, arg.walkEnd = start, q.End, 0
		n, err := pagemapScan(p.f, &arg, p.vec)
		if err != nil {
			return dst, fmt.Errorf("PAGEMAP_SCAN %#x-%#x: %w", start, q.End, err)
		}
		next := start
		for _, r := range p.vec[:n] {
			if r.start < next || r.end > q.End || r.end <= r.start {
				return dst, fmt.Errorf("PAGEMAP_SCAN %#x-%#x: %w", start, q.End, fmt.Errorf("%w: region out of order", proc.ErrMalformed))
			}
			dst = appendRun(dst, r.start, r.end, Category(r.categories)&q.Return)
			next = r.end
		}
		if n < len(p.vec) {
			// The walk ends early only when the vector is full. (Linux
			// 6.18 can report a walk_end short of where a walk that did
			// not fill the vector ended, so it is not trusted here.)
			break
		}
		// The vector is full: go on after what was reported. The last
		// region may continue; appendRun merges it.
		start = max(next, min(arg.walkEnd, q.End))
	}
	return dst, nil
}
