package image

import (
	"errors"
	"fmt"
	"io"

	"github.com/lazyfs/lazyfs/engine/image/store"
)

// OpenStore opens the files of the snapshot at dir (a directory, an
// address, or an archive file) without reading them: what copies a
// snapshot whole, sealed or not, reads it with.
func OpenStore(dir string, o OpenOptions) (store.Store, error) {
	return store.Open(dir, o.Trust, o.Remote)
}

// ReadManifest reads and checks the manifest of the snapshot st holds.
func ReadManifest(st store.Store) (*Manifest, []byte, error) {
	b, err := readManifestBytes(st)
	if err != nil {
		return nil, nil, err
	}
	m, err := parseManifest(b)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", joinName(st.String(), ManifestName), err)
	}
	return m, b, nil
}

// readAll reads the whole file name of st, of size bytes.
func readAll(st store.Store, name string, size int64, forget bool) ([]byte, error) {
	f, err := st.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fg, ok := f.(Forgetter); forget && (!ok || !fg.Forget(0, size)) {
		return nil, errors.New("nothing cached to fetch again")
	}
	b := make([]byte, size)
	if n, err := f.ReadAt(b, 0); n < len(b) {
		if err == io.EOF || err == nil {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return b, nil
}
