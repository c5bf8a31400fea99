package fs

import (
	"os"
	"strconv"
	"testing"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/fs/fstest"
)

func TestZZDemo(t *testing.T) {
	d := os.Getenv("DEMO_DIR")
	if d == "" {
		t.Skip()
	}
	mb, _ := strconv.Atoi(os.Getenv("DEMO_MB"))
	_, err := fstest.Write(d, image.Options{BlockSize: 256 << 10, Mode: codec.Compress},
		fstest.Process{PID: 999, Seed: 3, VMAs: bigLayout(8, uint64(mb)<<20/8)})
	if err != nil {
		t.Fatal(err)
	}
}
