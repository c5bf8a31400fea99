package corefile

import (
	"debug/elf"
	"encoding/binary"
	"path/filepath"
	"testing"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/imagetest"
)

// TestCoreManyVMAs: with 65535 program headers or more, e_phnum is
// PN_XNUM and the count is in sh_info of section 0, as the kernel writes
// it (readelf -l reads such a core; debug/elf does not).
func TestCoreManyVMAs(t *testing.T) {
	if testing.Short() {
		t.Skip("70000 VMAs")
	}
	const pid, n = 66, 70000
	var vmas []imagetest.VMA
	for i := range uint64(n) {
		a := 0x10000000 + 2*i*imagetest.PageSize
		vmas = append(vmas, imagetest.VMA{Start: a, End: a + imagetest.PageSize, Prot: protR, Kind: image.VMAFile, NotDumped: true})
	}
	vmas[n-1].NotDumped, vmas[n-1].Kind, vmas[n-1].Content = false, image.VMAAnon, imagetest.Text
	s, err := imagetest.Write(filepath.Join(t.TempDir(), "snap"), image.Options{BlockSize: 4 << 10, Mode: codec.Compress},
		imagetest.Process{PID: pid, Seed: 1, VMAs: vmas})
	if err != nil {
		t.Fatal(err)
	}
	c := openTestCore(t, s, pid)
	if got := binary.LittleEndian.Uint16(c.head[56:]); got != pnXNum {
		t.Fatalf("e_phnum %#x, want PN_XNUM", got)
	}
	h := c.head
	le := binary.LittleEndian
	shoff, shnum := le.Uint64(h[40:]), le.Uint16(h[60:])
	if shnum != 1 || shoff != elfHeaderSize+(n+1)*progHeaderSize {
		t.Fatalf("e_shnum %d, e_shoff %#x", shnum, shoff)
	}
	if info := le.Uint32(h[shoff+44:]); info != n+1 {
		t.Fatalf("sh_info %d, want %d program headers", info, n+1)
	}
	// debug/elf does not read PN_XNUM: the last program header by hand
	ph := h[elfHeaderSize+n*progHeaderSize:]
	if elf.ProgType(le.Uint32(ph)) != elf.PT_LOAD || le.Uint64(ph[16:]) != vmas[n-1].Start {
		t.Fatalf("last program header %x", ph[:progHeaderSize])
	}
	off, filesz := le.Uint64(ph[8:]), le.Uint64(ph[32:])
	b := make([]byte, filesz)
	if _, err := (coreReader{c}).ReadAt(b, int64(off)); err != nil || string(b[:len(imagetest.Marker)]) != imagetest.Marker {
		t.Fatalf("last PT_LOAD: %q, %v", b[:32], err)
	}
}
