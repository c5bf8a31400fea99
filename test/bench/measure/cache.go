package measure

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// DirSize is the total size of the regular files in dir.
func DirSize(dir string) (uint64, error) {
	es, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("snapshot size: %w", err)
	}
	var n uint64
	for _, e := range es {
		info, err := e.Info()
		if err != nil {
			return 0, fmt.Errorf("snapshot size: %w", err)
		}
		if info.Mode().IsRegular() {
			n += uint64(info.Size())
		}
	}
	return n, nil
}

// dropCaches writes back dirty pages and drops the page cache, so that the
// next command reads the snapshot (and its own binary) from the disk.
func dropCaches() error {
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0); err != nil {
		return fmt.Errorf("drop caches: %w", err)
	}
	return nil
}

// WarmUp reads every file in dir, so that they are in the page cache.
func WarmUp(paths ...string) error {
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("warm up: %w", err)
		}
		_, err = io.Copy(io.Discard, f)
		f.Close()
		if err != nil {
			return fmt.Errorf("warm up %s: %w", p, err)
		}
	}
	return nil
}

// SnapshotFiles lists the regular files of a snapshot directory.
func SnapshotFiles(dir string) ([]string, error) {
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list snapshot: %w", err)
	}
	var out []string
	for _, e := range es {
		if e.Type().IsRegular() {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out, nil
}

// SetCache drops the page cache for a cold run, or reads paths into it for a
// warm one.
func SetCache(cold bool, paths ...string) error {
	if cold {
		return dropCaches()
	}
	return WarmUp(paths...)
}
