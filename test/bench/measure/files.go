package measure

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Mounted reports whether something is mounted on dir.
func Mounted(dir string) bool {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == dir {
			return true
		}
	}
	return false
}

// CopyData copies the data segments of a sparse file (SEEK_DATA /
// SEEK_HOLE) back to back into dst and returns the bytes copied.
func CopyData(src, dst string) (uint64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return 0, fmt.Errorf("create raw memory file: %w", err)
	}
	defer out.Close()
	fd := int(in.Fd())
	buf := make([]byte, 1<<20)
	var total uint64
	for off := int64(0); ; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			return total, fmt.Errorf("seek data in %s: %w", src, err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return total, fmt.Errorf("seek hole in %s: %w", src, err)
		}
		for off = data; off < hole; {
			n, err := in.ReadAt(buf[:min(int64(len(buf)), hole-off)], off)
			if n > 0 {
				if _, err := out.Write(buf[:n]); err != nil {
					return total, fmt.Errorf("write raw memory file: %w", err)
				}
			}
			off += int64(n)
			total += uint64(n)
			if err != nil && !(errors.Is(err, io.EOF) && off == hole) {
				return total, fmt.Errorf("read memory at %#x: %w", off, err)
			}
		}
	}
	if err := out.Close(); err != nil {
		return total, fmt.Errorf("write raw memory file: %w", err)
	}
	if total == 0 {
		return 0, fmt.Errorf("%s holds no data", src)
	}
	return total, nil
}
