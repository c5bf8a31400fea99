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

// pool recycles buffers by size class. It keeps up to limit bytes of free
// buffers for good rather than in a sync.Pool: on machines with free page
// reporting (VM guests), memory the garbage collector returns to the host
// costs ~10x more to touch again than a reused buffer (a fresh 256 KiB
// buffer took ~900 us to fill, a reused one ~20 us), and a sync.Pool loses
// its buffers at every collection.
type pool struct {
	mu sync.Mutex
	// +checklocks:mu
	classes [classCount][][]byte
	// +checklocks:mu
	bytes int64 // free bytes held
	limit int64 // set before first use
}

// get returns a buffer of len size. Its contents are not cleared.
func (p *pool) get(size int) []byte {
	idx, n := class(size)
	if idx < 0 {
		return make([]byte, size)
	}
	p.mu.Lock()
	if l := len(p.classes[idx]); l > 0 {
		b := p.classes[idx][l-1]
		p.classes[idx][l-1] = nil
		p.classes[idx] = p.classes[idx][:l-1]
		p.bytes -= int64(cap(b))
		p.mu.Unlock()
		return b[:size]
	}
	p.mu.Unlock()
	return make([]byte, size, n)
}

// put recycles a buffer from get. Buffers that are not of a class size, or
// that would take the free bytes past the limit, are dropped.
func (p *pool) put(b []byte) {
	idx, n := class(cap(b))
	if idx < 0 || n != cap(b) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bytes+int64(n) > p.limit {
		return
	}
	p.classes[idx] = append(p.classes[idx], b[:cap(b)])
	p.bytes += int64(n)
}
