package codec

import (
	"hash/crc32"
	"sync"
)

// PageChecksums appends to dst the CRC32C of every page of b (len(b) a
// multiple of PageSize) and returns it with the CRC32C of the whole of b,
// computed from the pages' without a second pass over the bytes. A Raw
// block's page checksums let a reader that needs one page of it read and
// check that page alone.
func PageChecksums(dst []uint32, b []byte) ([]uint32, uint32) {
	var crc uint32
	for off := 0; off < len(b); off += PageSize {
		c := Checksum(b[off : off+PageSize])
		dst = append(dst, c)
		if off == 0 {
			crc = c
		} else {
			crc = combinePage(crc, c)
		}
	}
	return dst, crc
}

// pageShift holds, for each bit of a CRC32C register, the register that
// bit becomes after PageSize zero bytes. The register's advance over zero
// bytes is linear, so CRC(A || B) = advance(CRC(A), len(B)) ^ CRC(B) (the
// pre- and post-inversion of the standard CRC cancel out), which is how
// zlib's crc32_combine works.
var pageShift = sync.OnceValue(func() (cols [32]uint32) {
	zero := make([]byte, PageSize)
	for j := range cols {
		// Update inverts before and after: undo both to advance the raw
		// register.
		cols[j] = ^crc32.Update(^(uint32(1) << j), castagnoli, zero)
	}
	return cols
})

// combinePage returns the CRC32C of A || B from crc1 = CRC32C(A) and crc2
// = CRC32C(B), len(B) == PageSize.
func combinePage(crc1, crc2 uint32) uint32 {
	cols := pageShift()
	var x uint32
	for j := 0; crc1 != 0; j++ {
		if crc1&1 != 0 {
			x ^= cols[j]
		}
		crc1 >>= 1
	}
	return x ^ crc2
}
