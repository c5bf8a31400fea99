package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const blk = 64 << 10

// fill returns a load function that writes a pattern derived from key.
func fill(key Key, calls *atomic.Int64) func([]byte) error {
	return func(dst []byte) error {
		if calls != nil {
			calls.Add(1)
		}
		pattern(key, dst)
		return nil
	}
}

// pattern fills dst with bytes that depend on key and on the position.
func pattern(key Key, dst []byte) {
	for i := 0; i < len(dst) && i < 256; i++ {
		dst[i] = byte(key.File*31 + key.Block*7 + uint64(i))
	}
	for n := 256; n < len(dst); n *= 2 {
		copy(dst[n:], dst[:n])
	}
}

func want(key Key, n int) []byte {
	b := make([]byte, n)
	pattern(key, b)
	return b
}

func get(t *testing.T, c *Cache, key Key, size int, load func([]byte) error) *Ref {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.Get(ctx, key, size, load)
	if err != nil {
		t.Fatalf("get %v: %v", key, err)
	}
	return r
}

// waitWaiters waits until n Gets wait for the load of key.
func waitWaiters(t *testing.T, c *Cache, key Key, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		cl := c.loading[key]
		got := 0
		if cl != nil {
			got = cl.waiters
		}
		c.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters for %v, want %d", got, key, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestHitMiss(t *testing.T) {
	c := New(1 << 20)
	var calls atomic.Int64
	k := Key{File: c.NewFile(), Block: 3}
	r := get(t, c, k, blk, fill(k, &calls))
	if !bytes.Equal(r.Bytes(), want(k, blk)) {
		t.Fatal("loaded bytes differ")
	}
	r.Release()
	r.Release() // harmless
	r = get(t, c, k, blk, fill(k, &calls))
	if !bytes.Equal(r.Bytes(), want(k, blk)) {
		t.Fatal("cached bytes differ")
	}
	r.Release()
	if p, ok := c.Peek(k); !ok || !bytes.Equal(p.Bytes(), want(k, blk)) {
		t.Fatal("peek missed a cached block")
	} else {
		p.Release()
	}
	if _, ok := c.Peek(Key{File: k.File, Block: 4}); ok {
		t.Fatal("peek hit a block never loaded")
	}
	if _, err := c.Get(context.Background(), k, blk/2, fill(k, &calls)); err == nil {
		t.Error("get with another size: no error")
	}
	s := c.Stats()
	if calls.Load() != 1 || s.Misses != 1 || s.Hits != 3 || s.Entries != 1 || s.Bytes != blk || s.MaxBytes != 1<<20 {
		t.Errorf("loads %d, stats %+v", calls.Load(), s)
	}
	if a, b := c.NewFile(), c.NewFile(); b <= a || a <= k.File {
		t.Errorf("NewFile not increasing: %d, %d after %d", a, b, k.File)
	}
}

func TestSingleflight(t *testing.T) {
	const n = 32
	c := New(1 << 20)
	k := Key{File: 1, Block: 1}
	var calls atomic.Int64
	release := make(chan struct{})
	load := func(dst []byte) error {
		calls.Add(1)
		<-release
		pattern(k, dst)
		return nil
	}
	var wg sync.WaitGroup
	refs := make([]*Ref, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			refs[i], errs[i] = c.Get(ctx, k, blk, load)
		})
	}
	waitWaiters(t, c, k, n-1)
	close(release)
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("get %d: %v", i, errs[i])
		}
		if !bytes.Equal(refs[i].Bytes(), want(k, blk)) {
			t.Fatalf("get %d: wrong bytes", i)
		}
	}
	if calls.Load() != 1 {
		t.Errorf("load called %d times, want 1", calls.Load())
	}
	c.mu.Lock()
	e, _ := c.lru.Peek(k)
	if e.refs != n {
		t.Errorf("%d references, want %d", e.refs, n)
	}
	c.mu.Unlock()
	for _, r := range refs {
		r.Release()
	}
	c.mu.Lock()
	if e.refs != 0 {
		t.Errorf("%d references after release, want 0", e.refs)
	}
	c.mu.Unlock()
	if s := c.Stats(); s.Misses != 1 || s.Hits != n-1 {
		t.Errorf("stats %+v, want 1 miss and %d hits", s, n-1)
	}
}

func TestLoadErrorNotCached(t *testing.T) {
	const n = 8
	c := New(1 << 20)
	k := Key{File: 1, Block: 1}
	boom := errors.New("boom")
	release := make(chan struct{})
	var calls atomic.Int64
	load := func([]byte) error {
		calls.Add(1)
		<-release
		return boom
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, errs[i] = c.Get(ctx, k, blk, load)
		})
	}
	waitWaiters(t, c, k, n-1)
	close(release)
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, boom) {
			t.Errorf("get %d: %v, want %v", i, err, boom)
		}
	}
	if calls.Load() != 1 {
		t.Errorf("failing load called %d times, want 1", calls.Load())
	}
	r := get(t, c, k, blk, fill(k, &calls))
	defer r.Release()
	if calls.Load() != 2 || !bytes.Equal(r.Bytes(), want(k, blk)) {
		t.Errorf("error was cached: %d loads", calls.Load())
	}
}

func TestWaiterContext(t *testing.T) {
	c := New(1 << 20)
	k := Key{File: 1, Block: 1}
	release := make(chan struct{})
	loaded := make(chan *Ref)
	go func() {
		r, _ := c.Get(context.Background(), k, blk, func(dst []byte) error {
			<-release
			pattern(k, dst)
			return nil
		})
		loaded <- r
	}()
	for {
		c.mu.Lock()
		_, ok := c.loading[k]
		c.mu.Unlock()
		if ok {
			break
		}
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.Get(ctx, k, blk, fill(k, nil)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiter: %v, want DeadlineExceeded", err)
	}
	close(release)
	var r *Ref
	select {
	case r = <-loaded:
	case <-time.After(10 * time.Second):
		t.Fatal("loader did not return")
	}
	c.mu.Lock()
	refs := r.e.refs
	c.mu.Unlock()
	if refs != 1 {
		t.Errorf("%d references after the waiter left, want 1", refs)
	}
	r.Release()
}

// TestLoaderCancelled: the loader's own context ended; a waiter whose
// context is alive loads the block itself instead of failing.
func TestLoaderCancelled(t *testing.T) {
	c := New(1 << 20)
	k := Key{File: 1, Block: 1}
	release := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := c.Get(context.Background(), k, blk, func([]byte) error {
			<-release
			return fmt.Errorf("read: %w", context.Canceled)
		})
		first <- err
	}()
	waiter := make(chan *Ref, 1)
	go func() {
		for {
			c.mu.Lock()
			_, ok := c.loading[k]
			c.mu.Unlock()
			if ok {
				break
			}
			time.Sleep(time.Millisecond)
		}
		r, err := c.Get(context.Background(), k, blk, fill(k, nil))
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		waiter <- r
	}()
	waitWaiters(t, c, k, 1)
	close(release)
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Errorf("loader: %v", err)
	}
	select {
	case r := <-waiter:
		if r == nil || !bytes.Equal(r.Bytes(), want(k, blk)) {
			t.Fatal("waiter did not load the block")
		}
		r.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("waiter did not return")
	}
}

func TestLoadPanic(t *testing.T) {
	c := New(1 << 20)
	k := Key{File: 1, Block: 1}
	loading := make(chan struct{})
	waiterErr := make(chan error, 1)
	go func() {
		<-loading
		_, err := c.Get(context.Background(), k, blk, fill(k, nil))
		waiterErr <- err
	}()
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the loader's panic was swallowed")
			}
		}()
		c.Get(context.Background(), k, blk, func([]byte) error {
			close(loading)
			waitWaiters(t, c, k, 1)
			panic("load bug")
		})
	}()
	select {
	case err := <-waiterErr:
		if !errors.Is(err, ErrLoadPanicked) {
			t.Errorf("waiter: %v, want ErrLoadPanicked", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter still waiting for a load that panicked")
	}
	r := get(t, c, k, blk, fill(k, nil)) // not stuck
	r.Release()
}

func TestByteBound(t *testing.T) {
	const max = 1 << 20
	c := New(max)
	f := c.NewFile()
	hot := Key{File: f, Block: 0}
	for i := range 100 {
		k := Key{File: f, Block: uint64(i)}
		get(t, c, k, blk, fill(k, nil)).Release()
		get(t, c, hot, blk, fill(hot, nil)).Release() // keep block 0 recent
		if s := c.Stats(); s.Bytes > max {
			t.Fatalf("after %d blocks: %d bytes cached, max %d", i+1, s.Bytes, max)
		}
	}
	s := c.Stats()
	if s.Entries != max/blk || s.Bytes != max || s.Evictions != 100-max/blk {
		t.Errorf("stats %+v, want %d entries, %d bytes, %d evictions", s, max/blk, max, 100-max/blk)
	}
	if r, ok := c.Peek(hot); !ok {
		t.Error("the most recently used block was evicted")
	} else {
		r.Release()
	}
	if _, ok := c.Peek(Key{File: f, Block: 1}); ok {
		t.Error("the least recently used block is still cached")
	}

	// Sizes round up to a size class, and the bound counts the class.
	c = New(max)
	k := Key{File: 9, Block: 9}
	get(t, c, k, 3*4096+1, fill(k, nil)).Release()
	if s := c.Stats(); s.Bytes != 4*4096 {
		t.Errorf("a block of 3 pages and a byte counts %d bytes, want %d", s.Bytes, 4*4096)
	}
}

func TestTooLarge(t *testing.T) {
	c := New(blk)
	k := Key{File: 1, Block: 1}
	var calls atomic.Int64
	r := get(t, c, k, 2*blk, fill(k, &calls))
	if !bytes.Equal(r.Bytes(), want(k, 2*blk)) {
		t.Fatal("wrong bytes")
	}
	r.Release()
	if s := c.Stats(); s.Entries != 0 || s.Bytes != 0 {
		t.Errorf("a block larger than the cache was retained: %+v", s)
	}
	get(t, c, k, 2*blk, fill(k, &calls)).Release()
	if calls.Load() != 2 {
		t.Errorf("%d loads, want 2", calls.Load())
	}

	c = New(0) // retains nothing, still works
	get(t, c, k, blk, fill(k, nil)).Release()
	if s := c.Stats(); s.Entries != 0 {
		t.Errorf("New(0) retained %+v", s)
	}
}

// TestRefSurvivesEviction holds a Ref while its entry is evicted and many
// more blocks of the same size are loaded (and recycled): its bytes must not
// change until it is released.
func TestRefSurvivesEviction(t *testing.T) {
	c := New(4 * blk)
	held := Key{File: 1, Block: 0}
	r := get(t, c, held, blk, fill(held, nil))
	for i := 1; i < 200; i++ {
		k := Key{File: 1, Block: uint64(i)}
		get(t, c, k, blk, fill(k, nil)).Release()
	}
	if _, ok := c.Peek(held); ok {
		t.Fatal("held block was not evicted; the test proves nothing")
	}
	if !bytes.Equal(r.Bytes(), want(held, blk)) {
		t.Fatal("bytes of a held, evicted block changed")
	}
	e := r.e
	r.Release()
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.buf != nil || e.refs != 0 {
		t.Errorf("evicted block not recycled after its last release: refs %d", e.refs)
	}
}

// TestConcurrent runs readers over a small cache with random keys and
// sizes and checks every block they see; run it with -race.
func TestConcurrent(t *testing.T) {
	c := New(128 << 10)
	sizes := []int{4096, 3 * 4096, 16 << 10, 40 << 10}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var held []*Ref
			var heldKeys []Key
			for range 400 {
				b := uint64(rng.IntN(32))
				k := Key{File: 1, Block: b}
				size := sizes[b%uint64(len(sizes))]
				r, err := c.Get(ctx, k, size, fill(k, nil))
				if err != nil {
					t.Error(err)
					return
				}
				held = append(held, r)
				heldKeys = append(heldKeys, k)
				if len(held) > 3 || rng.IntN(2) == 0 {
					i := rng.IntN(len(held))
					if !bytes.Equal(held[i].Bytes(), want(heldKeys[i], len(held[i].Bytes()))) {
						t.Errorf("block %v changed while held", heldKeys[i])
						return
					}
					held[i].Release()
					held = append(held[:i], held[i+1:]...)
					heldKeys = append(heldKeys[:i], heldKeys[i+1:]...)
				}
			}
			for _, r := range held {
				r.Release()
			}
		})
	}
	wg.Wait()
	s := c.Stats()
	if s.Bytes > s.MaxBytes || s.Hits+s.Misses != 8*400 {
		t.Errorf("stats %+v", s)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range c.lru.Keys() {
		if e, _ := c.lru.Peek(k); e.refs != 0 {
			t.Errorf("%v has %d references after every release", k, e.refs)
		}
	}
}

func TestClass(t *testing.T) {
	prevCap := 0
	prevIdx := -1
	for size := 1; size <= 4<<20; size += 1024 {
		idx, n := class(size)
		if n < size || (size > smallLimit && n-size >= n/4+1) || (size <= smallLimit && n-size >= pageSize) {
			t.Fatalf("class(%d) = %d bytes", size, n)
		}
		if n%pageSize != 0 || idx < prevIdx || idx >= classCount || (idx == prevIdx && n != prevCap) {
			t.Fatalf("class(%d) = %d, %d after %d, %d", size, idx, n, prevIdx, prevCap)
		}
		if i2, n2 := class(n); i2 != idx || n2 != n {
			t.Fatalf("class of the capacity %d is %d, %d, not %d", n, i2, n2, idx)
		}
		prevIdx, prevCap = idx, n
	}
	if idx, _ := class(4<<20 + 1); idx != -1 {
		t.Error("buffers above 4 MiB are pooled")
	}
	if prevIdx != classCount-1 {
		t.Errorf("last class %d, want %d", prevIdx, classCount-1)
	}
}

func TestContainsCountsNothing(t *testing.T) {
	c := New(1 << 20)
	k := Key{File: c.NewFile(), Block: 1}
	if c.Contains(k) {
		t.Fatal("empty cache contains a key")
	}
	r, err := c.Get(context.Background(), k, 4096, func(dst []byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	r.Release()
	before := c.Stats()
	if !c.Contains(k) {
		t.Fatal("loaded key not contained")
	}
	if after := c.Stats(); after.Hits != before.Hits || after.Misses != before.Misses {
		t.Fatalf("Contains changed the counters: %+v -> %+v", before, after)
	}
}

func TestPoolKeepsBuffersWithinLimit(t *testing.T) {
	p := &pool{limit: 1 << 20}
	var bufs [][]byte
	for i := 0; i < 8; i++ {
		bufs = append(bufs, p.get(256<<10))
	}
	for _, b := range bufs {
		p.put(b)
	}
	if p.bytes != 1<<20 {
		t.Fatalf("pool holds %d free bytes, want its limit %d", p.bytes, 1<<20)
	}
	b := p.get(250 << 10) // same class as 256 KiB: reused
	if cap(b) != 256<<10 || p.bytes != 768<<10 {
		t.Fatalf("get after put: cap %d, pool %d bytes", cap(b), p.bytes)
	}
}
