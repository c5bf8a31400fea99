package measure

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// InNetns runs fn on a thread in the network namespace of pid, so that
// the sockets it makes live there; the thread goes back to ours after (or
// is dropped).
func InNetns(pid int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ours, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer ours.Close()
		f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		err = fn()
		if unix.Setns(int(ours.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// SmapsRollup returns the Pss and Anonymous of pid, in bytes.
func SmapsRollup(pid int) (pss, anon uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("smaps_rollup of %d: %q: %w", pid, line, ErrOutput)
		}
		switch f[0] {
		case "Pss:":
			pss = v << 10
		case "Anonymous:":
			anon = v << 10
		}
	}
	return pss, anon, nil
}

// ResidentBytes is how much of path the page cache holds: mincore of a
// read-only mapping of each of its data ranges (SEEK_DATA, SEEK_HOLE:
// a mount's mem file is sparse, its offsets addresses), as fincore does.
func ResidentBytes(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	page := int64(os.Getpagesize())
	var n uint64
	for off := int64(0); ; {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return n, nil
		}
		if err != nil {
			return 0, fmt.Errorf("SEEK_DATA %s: %w", path, err)
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return 0, fmt.Errorf("SEEK_HOLE %s: %w", path, err)
		}
		start := data &^ (page - 1)
		m, err := unix.Mmap(int(f.Fd()), start, int(hole-start), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return 0, fmt.Errorf("mmap %s: %w", path, err)
		}
		vec := make([]byte, (int64(len(m))+page-1)/page)
		_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0])))
		unix.Munmap(m)
		if e != 0 {
			return 0, fmt.Errorf("mincore %s: %w", path, e)
		}
		for _, v := range vec {
			n += uint64(v&1) * uint64(page)
		}
		off = hole
	}
}

// ServerRSS is the Rss of the lazyfs server of mnt: the process running
// the lazyfs binary with mnt in its arguments.
func ServerRSS(bin, mnt string) (uint64, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")
		if len(args) < 2 || args[len(args)-1] != mnt {
			continue
		}
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || exe != bin {
			continue
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			return 0, err
		}
		for line := range strings.Lines(string(st)) {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				if err != nil {
					return 0, fmt.Errorf("VmRSS %q: %w", line, ErrOutput)
				}
				return kb << 10, nil
			}
		}
	}
	return 0, errors.New("no lazyfs server found for " + mnt)
}

// BlockCacheBytes reads cache_bytes from a mount's MNT/PID/stats: the
// decoded blocks its block cache holds.
func BlockCacheBytes(stats string) (uint64, error) {
	b, err := os.ReadFile(stats)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "cache_bytes" {
			v, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %q: %w", stats, line, ErrOutput)
			}
			return v, nil
		}
	}
	return 0, fmt.Errorf("%s: no cache_bytes: %w", stats, ErrOutput)
}
