package lazy

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/uffd"
)

// fakeBlocks is one 64 KiB Raw block at 0x10000 whose reads return err.
type fakeBlocks struct{ err error }

func (f fakeBlocks) BlockAt(addr uint64) (image.Block, bool) {
	if addr >= 0x10000 && addr < 0x20000 {
		return image.Block{Index: 1, Addr: 0x10000, Len: 0x10000, Kind: codec.Raw}, true
	}
	return image.Block{}, false
}

func (f fakeBlocks) ReadAt(p []byte, off int64) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	return len(p), nil
}

// TestExplainRead: a read the page source failed is read again from the
// snapshot, and the error says which failed: the block (corrupt), the
// snapshot itself (a store gone: its error, not "read fine"), or only the
// source.
func TestExplainRead(t *testing.T) {
	failed := &uffd.ServeError{Op: "read", Addr: 0x7f0000010000, Len: 0x4000, Src: 0x10000, Err: syscall.EIO}
	refused := errors.New("dial tcp 127.0.0.1:9000: connect: connection refused")
	corrupt := &image.BlockError{File: "pages-1.img", Block: 1, Addr: 0x10000, Err: image.ErrCorrupt}
	for _, tc := range []struct {
		name  string
		err   error
		is    []error
		words string
	}{
		{"source only", nil, []error{syscall.EIO}, "read fine there"},
		{"snapshot unreadable", refused, []error{syscall.EIO, refused}, "connection refused"},
		{"block corrupt", corrupt, []error{image.ErrCorrupt}, "pages-1.img"},
	} {
		got := explainRead(fakeBlocks{tc.err}, failed)
		for _, want := range tc.is {
			if !errors.Is(got, want) {
				t.Errorf("%s: %v does not wrap %v", tc.name, got, want)
			}
		}
		if !strings.Contains(got.Error(), tc.words) {
			t.Errorf("%s: %q does not say %q", tc.name, got, tc.words)
		}
	}
}
