package cache

import (
	"math/bits"
	"sync"
)

// Buffers come from size classes so that a block of one size can reuse the
// buffer of an evicted block of a similar size:
//
//	up to 64 KiB      every multiple of 4 KiB          (16 classes)
//	64 KiB to 4 MiB   four steps per power of two:     (24 classes)
//	                  5/4, 6/4, 7/4 and 8/4 of 2^k
//
// so a buffer wastes at most a page or a quarter of its size. Larger
// buffers are allocated exactly and not pooled.
const (
	pageSize    = 4096
	smallLimit  = 64 << 10
	smallCount  = smallLimit / pageSize
	maxPooled   = 4 << 20
	classCount  = smallCount + 4*(22-16) // 64 KiB = 2^16 up to 4 MiB = 2^22
	smallLimitK = 16                     // log2(smallLimit)
)

// class returns the size class of a buffer of size bytes and its capacity,
// or -1 if such buffers are not pooled.
func class(size int) (idx, capacity int) {
	switch {
	case size <= 0:
		return -1, 0
	case size <= smallLimit:
		n := (size + pageSize - 1) / pageSize
		return n - 1, n * pageSize
	case size > maxPooled:
		return -1, size
	}
	k := bits.Len(uint(size-1)) - 1 // 2^k < size <= 2^(k+1), k >= 16
	step := 1 << (k - 2)
	q := (size - 1<<k + step - 1) / step // 1..4
	return smallCount + 4*(k-smallLimitK) + q - 1, 1<<k + q*step
}

// pool recycles buffers by size class. It may drop buffers at any time
// (sync.Pool), so it holds no memory the garbage collector cannot reclaim.
type pool struct {
	classes [classCount]sync.Pool // of *[]byte
}

// get returns a buffer of len size. Its contents are not cleared.
func (p *pool) get(size int) []byte {
	idx, n := class(size)
	if idx < 0 {
		return make([]byte, size)
	}
	if v, ok := p.classes[idx].Get().(*[]byte); ok {
		return (*v)[:size]
	}
	return make([]byte, size, n)
}

// put recycles a buffer from get. Buffers that are not of a class size are
// dropped.
func (p *pool) put(b []byte) {
	idx, n := class(cap(b))
	if idx < 0 || n != cap(b) {
		return
	}
	b = b[:cap(b)]
	p.classes[idx].Put(&b)
}
