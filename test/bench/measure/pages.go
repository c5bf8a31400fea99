package measure

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

// PagesFileBytes returns the size of the pages file of pid in the
// snapshot at dir, as its manifest records it.
func PagesFileBytes(dir string, pid int) (int64, error) {
	b, err := os.ReadFile(filepath.Join(dir, image.ManifestName))
	if err != nil {
		return 0, err
	}
	var m image.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return 0, err
	}
	e, ok := m.Process(pid)
	if !ok {
		return 0, fmt.Errorf("%s: no process %d", dir, pid)
	}
	return m.Files[e.Pages].Size, nil
}

// Evict drops the cached pages of the file at path, if it exists.
func Evict(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}
