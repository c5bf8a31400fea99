package check

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc/pagemap"
	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
)

// checkUserfaultfd checks userfaultfd for lazy restore (the features it
// needs, and a MISSING registration) and WP_ASYNC for pre-copy dumps (--pre-copy).
func checkUserfaultfd() []Feature {
	var out []Feature
	supported, err := uffdFeatures()
	var detail string
	if err == nil {
		if miss := uffdio.RequiredFeatures &^ supported; miss != 0 {
			err = fmt.Errorf("UFFDIO_API lacks features %#x (fork, remap, remove and unmap events)", miss)
		}
	}
	if err == nil {
		detail, err = uffdRegisterMissing()
	}
	out = append(out, feature("userfaultfd", neededLazy, err, detail))
	if err == nil && supported&uffdio.FeatureWPAsync == 0 {
		err = errors.New("UFFDIO_API lacks WP_ASYNC (Linux 6.7)")
	}
	return append(out, feature("uffd WP_ASYNC", neededPreCopy, err, fmt.Sprintf("UFFDIO_API features %#x", supported)))
}

func newUffd() (int, error) {
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if e != 0 {
		if e == unix.EPERM {
			return -1, fmt.Errorf("userfaultfd: %w (vm.unprivileged_userfaultfd=0 and no CAP_SYS_PTRACE)", e)
		}
		return -1, fmt.Errorf("userfaultfd: %w", e)
	}
	return int(fd), nil
}

// uffdFeatures returns the features UFFDIO_API offers.
func uffdFeatures() (uint64, error) {
	fd, err := newUffd()
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	supported, _, err := uffdio.API(fd, 0)
	return supported, err
}

// uffdRegisterMissing registers an anonymous page of ours in MISSING mode
// with the features lazy restore asks for.
func uffdRegisterMissing() (string, error) {
	fd, err := newUffd()
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	if _, _, err := uffdio.API(fd, uffdio.Features); err != nil {
		return "", err
	}
	page, err := unix.Mmap(-1, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return "", err
	}
	defer unix.Munmap(page)
	addr := uint64(uintptr(unsafe.Pointer(&page[0])))
	ioctls, err := uffdio.Register(fd, addr, pageSize, uffdio.RegisterModeMissing)
	if err != nil {
		return "", err
	}
	if err := uffdio.Unregister(fd, addr, pageSize); err != nil {
		return "", err
	}
	if ioctls&uffdio.IoctlCopy == 0 {
		return "", fmt.Errorf("UFFDIO_COPY not allowed on a MISSING range (ioctls %#x)", ioctls)
	}
	return "registered an anonymous range MISSING; UFFDIO_COPY allowed", nil
}

// checkPagemapScan scans a page of ours with PAGEMAP_SCAN.
func checkPagemapScan() Feature {
	const name = "PAGEMAP_SCAN"
	pm, err := pagemap.Open(os.Getpid())
	if err != nil {
		return feature(name, neededPreCopy, err, "")
	}
	defer pm.Close()
	if !pm.ScanSupported() {
		return feature(name, neededPreCopy, errors.New("ioctl on /proc/self/pagemap refused (Linux 6.7)"), "")
	}
	page, err := unix.Mmap(-1, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return feature(name, neededPreCopy, err, "")
	}
	defer unix.Munmap(page)
	page[0] = 1
	addr := uint64(uintptr(unsafe.Pointer(&page[0])))
	runs, err := pm.RunsScan(pagemap.Query{Start: addr, End: addr + pageSize, Require: pagemap.PagePresent}, nil)
	if err == nil && (len(runs) != 1 || runs[0].Start != addr) {
		err = fmt.Errorf("a present page scanned as %v", runs)
	}
	return feature(name, neededPreCopy, err, "found a page of ours present")
}
