package codec

import (
	"hash/crc32"
	"sync/atomic"
)

// zeroCRCs memoizes ZeroChecksum for every block length (page multiples up
// to MaxBlockSize). Bit 32 marks a computed entry. The values are a pure
// function of the length, so sharing them needs no more than atomics.
var zeroCRCs [MaxBlockSize/PageSize + 1]atomic.Uint64

// ZeroChecksum returns the CRC32C of n zero bytes, the checksum of a Zero
// block of length n. It is memoized for page multiples up to MaxBlockSize.
func ZeroChecksum(n int) uint32 {
	if n < 0 {
		n = 0
	}
	memo := n%PageSize == 0 && n <= MaxBlockSize
	if memo {
		if v := zeroCRCs[n/PageSize].Load(); v&(1<<32) != 0 {
			return uint32(v)
		}
	}
	var crc uint32
	for left := n; left > 0; {
		k := min(left, len(zeros))
		crc = crc32.Update(crc, castagnoli, zeros[:k])
		left -= k
	}
	if memo {
		zeroCRCs[n/PageSize].Store(1<<32 | uint64(crc))
	}
	return crc
}
