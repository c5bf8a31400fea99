package codec_test

import (
	"bytes"
	"fmt"

	"github.com/lazyfs/lazyfs/engine/codec"
)

// The block rule: a block of zeros is stored as nothing, one LZ4 shrinks
// by more than 12.5% as LZ4, any other as it is; DecodeChecked gives the
// bytes back, checked against the block's CRC32C.
func ExampleEncode() {
	const size = 64 << 10
	noise := make([]byte, size) // incompressible: an xorshift stream
	x := uint64(88172645463325252)
	for i := range noise {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		noise[i] = byte(x)
	}
	for _, block := range [][]byte{
		make([]byte, size),
		bytes.Repeat([]byte("weights 0.125 0.250 0.500\n"), size/26+1)[:size],
		noise,
	} {
		kind, stored := codec.Encode(nil, block, codec.DefaultMode)
		back := make([]byte, len(block))
		err := codec.DecodeChecked(back, kind, stored, codec.Checksum(block))
		stores := "all"
		switch {
		case len(stored) == 0:
			stores = "nothing"
		case len(stored) < len(block)/8:
			stores = "under an eighth"
		}
		fmt.Printf("%s: stores %s of the block; decoded equal: %v (%v)\n", kind, stores, bytes.Equal(back, block), err)
	}
	// Output:
	// zero: stores nothing of the block; decoded equal: true (<nil>)
	// lz4: stores under an eighth of the block; decoded equal: true (<nil>)
	// raw: stores all of the block; decoded equal: true (<nil>)
}
