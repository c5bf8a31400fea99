package archive_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/imagetest"
	"github.com/lazyfs/lazyfs/engine/image/store/archive"
)

// A snapshot written into one file, then opened from that file as any
// snapshot is, and a process's memory read from it.
func ExampleWrite() {
	tmp, _ := os.MkdirTemp("", "archive-example-")
	defer os.RemoveAll(tmp)
	// A snapshot of one synthetic process (snapctl dump writes real ones).
	snap, err := imagetest.Write(filepath.Join(tmp, "model"), image.Options{BlockSize: 64 << 10, Mode: codec.Compress},
		imagetest.Process{PID: 42, Seed: 1, VMAs: []imagetest.VMA{{Start: 0x10000000, End: 0x10100000, Prot: 3, Content: imagetest.Text}}})
	if err != nil {
		fmt.Println(err)
		return
	}

	// snapctl export: the archive of the snapshot, owner-only.
	st, err := image.OpenStore(snap.Dir, image.OpenOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	file := filepath.Join(tmp, "model.tar")
	f, _ := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	err = archive.Write(context.Background(), st, "model", f, nil)
	f.Close()
	st.Close()
	if err != nil {
		fmt.Println(err)
		return
	}

	// The archive is a snapshot: opened, checked and read in place.
	s, err := image.OpenWith(file, image.OpenOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	r, err := s.OpenPages(42, image.ReaderOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer r.Close()
	page := make([]byte, 64)
	if _, err := r.ReadAt(page, 0x10000000); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(s.PIDs(), strings.Fields(string(page))[0])
	// Output: [42] LAZYFS-MARKER
}
