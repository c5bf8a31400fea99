// Package cache holds decoded snapshot blocks in memory: an LRU bounded in
// bytes, with one load per block however many readers ask for it at once.
//
// # Loading
//
// Get returns the cached bytes of a block, or calls the caller's load
// function to fill a buffer. Concurrent Gets of a block that is missing call
// load once; the others wait for it, each honouring its own context. A load
// error is returned to every waiter and is not cached, so the next Get tries
// again. A waiter whose loader failed only because the loader's own context
// ended (context.Canceled or DeadlineExceeded) loads the block itself.
//
// # References and memory
//
// Every successful Get or Peek returns a *Ref that must be Released. An
// entry evicted while a Ref still holds it stays valid; its buffer goes back
// to a size-class pool only when the last Ref is released, so bytes handed
// to a reader (FUSE, UFFDIO_COPY) are never overwritten under it. Bytes in
// Stats counts the buffers the LRU retains (their capacity, which is the
// size rounded up to a size class); evicted buffers still referenced are
// not counted. A block larger than the whole cache is returned to its
// caller but not retained.
//
// # Blocks a reader keeps
//
// Served tells the cache that a range of a block was handed to a reader
// that keeps its own copy (a FUSE reply to a file the kernel caches in
// its page cache). Once every page of a retained block has been served,
// the block leaves the LRU at once: the reader's copy is the one kept, and
// a second one here would only hold the same bytes twice. What stays are
// the blocks served in part (the rest of them is still wanted) and those
// decoded ahead of a reader and not yet read.
//
// # Locking
//
// One mutex guards the LRU, the reference counts and the table of loads in
// progress; load functions run outside it. Counters are atomic, so Stats
// never blocks.
package cache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Key names a block: File is a key space from NewFile, Block an index in it.
type Key struct {
	File  uint64
	Block uint64
}

// Stats are the cache's counters, as the stats file reports them.
type Stats struct {
	Hits      int64 `json:"hits"`      // Gets and Peeks served without a load of their own
	Misses    int64 `json:"misses"`    // Gets that called load
	Evictions int64 `json:"evictions"` // entries dropped to stay within MaxBytes
	Bytes     int64 `json:"bytes"`     // bytes of the retained entries
	MaxBytes  int64 `json:"max_bytes"`
	Entries   int64 `json:"entries"` // retained entries
	Served    int64 `json:"served"`  // entries dropped once served whole (Served)
}

// ErrLoadPanicked is what waiters get when the load they waited for
// panicked (the loader's goroutine sees the panic itself).
var ErrLoadPanicked = errors.New("cache: load panicked")

// Cache is a byte-bounded LRU of decoded blocks. It is safe for concurrent
// use.
type Cache struct {
	max  int64
	pool pool

	mu sync.Mutex
	// +checklocks:mu
	lru *simplelru.LRU[Key, *entry]
	// +checklocks:mu
	loading map[Key]*call

	hits, misses, evictions, served atomic.Int64
	bytes, entries                  atomic.Int64 // changed under mu
	files                           atomic.Uint64
}

type entry struct {
	key      Key
	buf      []byte // len is the block size, cap its size class
	refs     int    // under Cache.mu
	retained bool   // in the LRU; under Cache.mu
	// served has a bit per page of buf handed to a reader that keeps it
	// (Served); nil until the first. Under Cache.mu.
	served []uint64
}

// call is a load in progress.
type call struct {
	done    chan struct{} // closed when finished
	waiters int           // Gets waiting; each gets a reference on success
	settled bool          // finished, under Cache.mu
	e       *entry
	err     error
}

// Ref is a reference to a cached block. Its bytes stay valid and unchanged
// until Release.
type Ref struct {
	c        *Cache
	e        *entry
	b        []byte
	released atomic.Bool
}

// New returns a cache that retains at most maxBytes bytes of blocks.
// maxBytes <= 0 retains nothing but still merges concurrent loads.
func New(maxBytes int64) *Cache {
	// Entries are bounded by bytes, not count: the LRU's own bound is never
	// reached.
	lru, err := simplelru.NewLRU[Key, *entry](math.MaxInt, nil)
	if err != nil {
		panic(err) // not reached: the size is positive
	}
	c := &Cache{
		max:     max(maxBytes, 0),
		lru:     lru,
		loading: make(map[Key]*call),
	}
	// Free buffers kept for reuse: a quarter of the cache, at least 8 MiB.
	c.pool.limit = max(c.max/4, 8<<20)
	return c
}

// NewFile returns a fresh File id for a key space, never returned before by
// this Cache.
func (c *Cache) NewFile() uint64 { return c.files.Add(1) }

// Get returns the cached block for key, or calls load with a buffer of len
// size to fill it. load must fill all of dst: the buffer may hold stale
// bytes from a recycled block. Concurrent Gets of the same missing key call
// load once; the others wait for it or for their ctx. A load error is
// returned to every waiter and not cached. A hit whose cached length is not
// size is an error. The Ref must be released.
func (c *Cache) Get(ctx context.Context, key Key, size int, load func(dst []byte) error) (*Ref, error) {
	if size < 0 {
		return nil, fmt.Errorf("cache: get %v: negative size %d", key, size)
	}
	for {
		c.mu.Lock()
		if e, ok := c.lru.Get(key); ok {
			e.refs++
			c.mu.Unlock()
			c.hits.Add(1)
			return c.checked(key, e, size)
		}
		cl, loading := c.loading[key]
		if !loading {
			cl = &call{done: make(chan struct{})}
			c.loading[key] = cl
			c.mu.Unlock()
			c.misses.Add(1)
			return c.load(key, size, load, cl)
		}
		cl.waiters++
		c.mu.Unlock()

		select {
		case <-cl.done:
		case <-ctx.Done():
			c.mu.Lock()
			if !cl.settled {
				cl.waiters--
				c.mu.Unlock()
				return nil, ctx.Err()
			}
			c.mu.Unlock()
			// The load finished as we gave up: drop the reference it left us.
			if cl.err == nil {
				c.release(cl.e)
			}
			return nil, ctx.Err()
		}
		if cl.err == nil {
			c.hits.Add(1)
			return c.checked(key, cl.e, size)
		}
		if isContextErr(cl.err) && ctx.Err() == nil {
			continue // the loader gave up, not the load: try ourselves
		}
		return nil, cl.err
	}
}

// Peek returns the cached block for key without loading it. A hit counts as
// a hit; a miss is not counted.
func (c *Cache) Peek(key Key) (*Ref, bool) {
	c.mu.Lock()
	e, ok := c.lru.Get(key)
	if ok {
		e.refs++
	}
	c.mu.Unlock()
	if !ok {
		return nil, false
	}
	c.hits.Add(1)
	return &Ref{c: c, e: e, b: e.buf}, true
}

// Contains reports whether key is cached, without counting a hit or a miss
// and without refreshing its place in the LRU order: for prefetchers that
// skip what is already there.
func (c *Cache) Contains(key Key) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Contains(key)
}

// Stats returns the current counters.
func (c *Cache) Stats() Stats {
	return Stats{
		Hits:      c.hits.Load(),
		Misses:    c.misses.Load(),
		Evictions: c.evictions.Load(),
		Bytes:     c.bytes.Load(),
		MaxBytes:  c.max,
		Entries:   c.entries.Load(),
		Served:    c.served.Load(),
	}
}

// Bytes returns the block's bytes, valid until Release. They must not be
// modified.
func (r *Ref) Bytes() []byte { return r.b }

// Release drops the reference. Releasing twice is harmless.
func (r *Ref) Release() {
	if r.released.Swap(true) {
		return
	}
	r.c.release(r.e)
}

// checked returns a Ref to e, which holds a reference for the caller, if
// its length is the size asked for.
func (c *Cache) checked(key Key, e *entry, size int) (*Ref, error) {
	if len(e.buf) != size {
		n := len(e.buf)
		c.release(e)
		return nil, fmt.Errorf("cache: get %v: cached block has %d bytes, not %d", key, n, size)
	}
	return &Ref{c: c, e: e, b: e.buf}, nil
}

// load runs the caller's load for a call it registered and settles the
// call, also if load panics.
func (c *Cache) load(key Key, size int, load func([]byte) error, cl *call) (*Ref, error) {
	buf := c.pool.get(size)
	returned := false
	defer func() {
		if !returned { // load panicked: release the waiters, keep panicking
			c.pool.put(buf)
			c.settle(key, cl, nil, ErrLoadPanicked)
		}
	}()
	err := load(buf)
	returned = true
	if err != nil {
		c.pool.put(buf)
		c.settle(key, cl, nil, err)
		return nil, err
	}
	e := &entry{key: key, buf: buf}
	c.settle(key, cl, e, nil)
	return &Ref{c: c, e: e, b: buf}, nil
}

// settle ends a load: on success the entry gets a reference for the loader
// and each waiter and joins the LRU if it fits.
func (c *Cache) settle(key Key, cl *call, e *entry, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.loading, key)
	cl.settled = true
	cl.e, cl.err = e, err
	close(cl.done)
	if e == nil {
		return
	}
	e.refs = 1 + cl.waiters
	cost := int64(cap(e.buf))
	if cost > c.max {
		return // returned to its readers, never retained
	}
	c.lru.Add(key, e)
	e.retained = true
	c.entries.Add(1)
	c.bytes.Add(cost)
	for c.bytes.Load() > c.max {
		_, old, ok := c.lru.RemoveOldest()
		if !ok {
			break
		}
		old.retained = false
		c.entries.Add(-1)
		c.bytes.Add(-int64(cap(old.buf)))
		c.evictions.Add(1)
		if old.refs == 0 {
			c.pool.put(old.buf)
			old.buf = nil
		}
	}
}

// Served notes that the bytes [lo, hi) of the block the Ref holds were
// handed to a reader that keeps them (the kernel's page cache, for a FUSE
// file opened with FOPEN_KEEP_CACHE). Only the pages that [lo, hi) covers
// whole count (and the block's last, short page if hi is its end). Once
// every page of the block has been served, the block leaves the LRU, if
// it is still there: it is not counted in Bytes any more, and its buffer
// is recycled once the last Ref is released. Serving a page twice is
// harmless.
func (r *Ref) Served(lo, hi int) { r.c.servedRange(r.e, lo, hi) }

func (c *Cache) servedRange(e *entry, lo, hi int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(e.buf)
	if !e.retained || n == 0 {
		return
	}
	lo, hi = max(lo, 0), min(hi, n)
	first := (lo + pageSize - 1) / pageSize
	last := hi / pageSize // pages [first, last) are covered whole
	pages := (n + pageSize - 1) / pageSize
	if hi == n {
		last = pages
	}
	if first >= last {
		return
	}
	if e.served == nil {
		e.served = make([]uint64, (pages+63)/64)
	}
	for p := first; p < last; p++ {
		e.served[p/64] |= 1 << (p % 64)
	}
	for p := 0; p < pages; p += 64 {
		want := ^uint64(0)
		if k := pages - p; k < 64 {
			want = 1<<k - 1
		}
		if e.served[p/64] != want {
			return
		}
	}
	// Served whole: the reader's copy is the one kept.
	if cur, ok := c.lru.Peek(e.key); !ok || cur != e {
		return
	}
	c.lru.Remove(e.key)
	e.retained = false
	e.served = nil
	c.entries.Add(-1)
	c.bytes.Add(-int64(cap(e.buf)))
	c.served.Add(1)
	if e.refs == 0 {
		c.pool.put(e.buf)
		e.buf = nil
	}
}

func (c *Cache) release(e *entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.refs--
	if e.refs < 0 {
		panic("cache: entry released more often than referenced")
	}
	if e.refs == 0 && !e.retained {
		c.pool.put(e.buf)
		e.buf = nil
	}
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
