package fs_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/lazyfs/lazyfs/fs"
)

// Mount a snapshot (as lazyfs SNAPSHOT MOUNTPOINT does) and read a
// process's memory at an address through its mem file. Mounting needs
// FUSE and, for the owner-only mount, to be its owner: this example is
// compiled, not run.
func ExampleMount() {
	mnt, _ := os.MkdirTemp("", "lazyfs-example-")
	defer os.Remove(mnt)
	srv, err := fs.Mount("/var/snap/redis", mnt, fs.Options{CacheSize: fs.DefaultCacheSize})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Unmount()
	mem, err := os.Open(filepath.Join(srv.Mountpoint(), "4242", "mem"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mem.Close()
	b := make([]byte, 64)
	if _, err := mem.ReadAt(b, 0x7f3a1c000000); err != nil { // offset = address
		fmt.Println(err)
		return
	}
	fmt.Printf("%q\n", b)
}
