package s3store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

const (
	// readChunk is the unit of a ranged read: aligned, cached whole.
	readChunk = 1 << 20
	// maxGet bounds the bytes of one GET (neighbouring chunks coalesced).
	maxGet = 8 << 20
	// maxInFlight bounds the GETs of one store at once.
	maxInFlight = 8
	// readRetryWindow is how long a read keeps trying a store it cannot
	// reach before it fails; retryWait is its first wait.
	readRetryWindow = 5 * time.Second
	retryWait       = 250 * time.Millisecond
	// readaheadChunks is how far ahead of a sequential reader chunks are
	// fetched.
	readaheadChunks = 16
)

// chunkKey names a chunk of an object in the memory cache.
type chunkKey struct {
	name string
	idx  int64
}

// file is one object opened for ranged reads: an image.File.
type file struct {
	s    *Store
	name string
	key  string
	obj  object
	// disk is the store's disk cache, or nil (the manifest is always read
	// from the store: it says what every other byte must be).
	disk *diskCache

	mu       sync.Mutex
	inFlight map[int64]*fetch // chunks being fetched
	last     int64            // end of the previous read, for readahead
	raNext   int64            // first chunk not yet asked ahead

	ctx    context.Context // readahead's, cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// fetch is one GET of chunks [lo, hi) that readers of those chunks wait
// for.
type fetch struct {
	lo, hi int64
	done   chan struct{}
	data   [][]byte // a buffer per chunk: the memory cache keeps them one by one
	err    error
}

func newFile(s *Store, name string, o object) *file {
	ctx, cancel := context.WithCancel(context.Background())
	f := &file{s: s, name: name, key: s.c.addr.key(name), obj: o, inFlight: map[int64]*fetch{}, last: -1, ctx: ctx, cancel: cancel}
	if name != "snapshot.json" {
		f.disk = s.disk
	}
	return f
}

// Close stops the file's readahead.
func (f *file) Close() error {
	f.cancel()
	f.wg.Wait()
	return nil
}

func (f *file) path() string { return f.s.c.addr.String() + "/" + f.name }

// ReadAt reads len(p) bytes at off: every chunk it touches from memory,
// the disk cache or the store.
func (f *file) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("%s: read at negative offset %d", f.path(), off)
	}
	if off >= f.obj.size {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	end := min(off+int64(len(p)), f.obj.size)
	lo, hi := off/readChunk, (end-1)/readChunk+1
	f.readahead(off, end, hi)
	chunks := make([][]byte, hi-lo)
	var missing []int64
	for i := lo; i < hi; i++ {
		if b, ok := f.cached(i); ok {
			chunks[i-lo] = b
		} else {
			missing = append(missing, i)
		}
	}
	if len(missing) > 0 {
		got, err := f.fetchChunks(context.Background(), missing, true)
		if err != nil {
			return 0, err
		}
		for i, b := range got {
			chunks[missing[i]-lo] = b
		}
	}
	n := 0
	for i := lo; i < hi; i++ {
		c := chunks[i-lo]
		start := max(off, i*readChunk) - i*readChunk
		stop := min(end, (i+1)*readChunk) - i*readChunk
		n += copy(p[n:], c[start:stop])
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// chunkLen returns the length of chunk i of the object.
func (f *file) chunkLen(i int64) int64 {
	return min(f.obj.size, (i+1)*readChunk) - i*readChunk
}

// cached returns chunk i from memory. Chunks in the disk cache are
// loaded as fetches are (get), so that readahead and the parallel fetches
// of one read load them too.
func (f *file) cached(i int64) ([]byte, bool) {
	return f.s.mem.Get(chunkKey{f.name, i})
}

// fetchChunks returns the chunks idx (sorted, ascending), fetching those
// not fetched already or being fetched with one GET per run of
// neighbours, at most maxGet bytes each, in parallel. With wait false
// (readahead) it only starts the fetches and returns nothing.
func (f *file) fetchChunks(ctx context.Context, idx []int64, wait bool) ([][]byte, error) {
	calls := make([]*fetch, len(idx))
	var mine []*fetch
	f.mu.Lock()
	for i := 0; i < len(idx); {
		if c, ok := f.inFlight[idx[i]]; ok {
			calls[i] = c
			i++
			continue
		}
		j := i + 1
		for j < len(idx) && idx[j] == idx[j-1]+1 && (idx[j]-idx[i]+1)*readChunk <= maxGet && f.inFlight[idx[j]] == nil {
			j++
		}
		c := &fetch{lo: idx[i], hi: idx[j-1] + 1, done: make(chan struct{})}
		for k := i; k < j; k++ {
			calls[k] = c
			f.inFlight[idx[k]] = c
		}
		mine = append(mine, c)
		i = j
	}
	f.mu.Unlock()
	for _, c := range mine {
		if wait {
			go f.get(ctx, c)
		} else {
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				f.get(ctx, c)
			}()
		}
	}
	if !wait {
		return nil, nil
	}
	out := make([][]byte, len(idx))
	for i, c := range calls {
		<-c.done
		if c.err != nil {
			return nil, c.err
		}
		out[i] = c.data[idx[i]-c.lo]
	}
	return out, nil
}

// get runs the GET of c, bounded by the store's slots, keeps its chunks
// and wakes whoever waits.
func (f *file) get(ctx context.Context, c *fetch) {
	defer func() {
		f.mu.Lock()
		for i := c.lo; i < c.hi; i++ {
			if f.inFlight[i] == c {
				delete(f.inFlight, i)
			}
		}
		f.mu.Unlock()
		close(c.done)
	}()
	select {
	case f.s.sem <- struct{}{}:
	case <-ctx.Done():
		c.err = ctx.Err()
		return
	}
	defer func() { <-f.s.sem }()
	if f.disk != nil {
		// From the disk cache if it holds them all; a chunk that fails
		// its check there is fetched again with the others.
		data := make([][]byte, 0, c.hi-c.lo)
		for i := c.lo; i < c.hi; i++ {
			b, ok := f.disk.get(f.s.c, f.key, f.obj, i, f.chunkLen(i))
			if !ok {
				break
			}
			data = append(data, b)
		}
		if len(data) == int(c.hi-c.lo) {
			c.data = data
			for i, b := range data {
				f.s.mem.Add(chunkKey{f.name, c.lo + int64(i)}, b)
			}
			return
		}
	}
	c.data, c.err = f.getChunks(ctx, c.lo, c.hi)
	if c.err != nil {
		return
	}
	for i := c.lo; i < c.hi; i++ {
		b := c.data[i-c.lo]
		f.s.mem.Add(chunkKey{f.name, i}, b)
		if f.disk != nil {
			f.disk.put(f.s.c, f.key, f.obj, i, b)
		}
	}
}

// getChunks reads chunks [lo, hi) of the object with one ranged GET
// (retried by the SDK), refusing an object whose ETag is no longer the
// one listed.
func (f *file) getChunks(ctx context.Context, lo, hi int64) ([][]byte, error) {
	start, end := lo*readChunk, min(f.obj.size, hi*readChunk)
	ctx, cancel := context.WithTimeout(ctx, readRetryWindow+maxAttempts*(getTimeout+maxBackoff))
	defer cancel()
	in := &s3.GetObjectInput{
		Bucket:  aws.String(f.s.c.addr.Bucket),
		Key:     aws.String(f.key),
		Range:   aws.String(fmt.Sprintf("bytes=%d-%d", start, end-1)),
		IfMatch: aws.String(f.obj.etag),
	}
	var lastErr error
	// The SDK retries a request that fails maxAttempts times, quickly;
	// past that, a store that cannot be reached (a restart, a network
	// blip) and a body cut short are tried again here, with a growing
	// wait, for readRetryWindow. A store that answers no (an API error)
	// is not asked again.
	first, wait := time.Now(), retryWait
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if time.Since(first)+wait > readRetryWindow {
				break
			}
			select {
			case <-time.After(wait):
			case <-ctx.Done():
			}
			wait = min(2*wait, maxBackoff)
		}
		out, err := f.s.c.s3.GetObject(ctx, in)
		if err != nil {
			var ae smithy.APIError
			if errors.As(err, &ae) || ctx.Err() != nil {
				return nil, f.s.c.storeError(fmt.Sprintf("read %s bytes %d-%d", f.name, start, end-1), err)
			}
			lastErr = err
			continue
		}
		bufs := make([][]byte, hi-lo)
		var n int64
		for i := range bufs {
			bufs[i] = make([]byte, f.chunkLen(lo+int64(i)))
			var m int
			m, err = io.ReadFull(out.Body, bufs[i])
			n += int64(m)
			if err != nil {
				break
			}
		}
		out.Body.Close()
		if err == nil {
			return bufs, nil
		}
		lastErr = fmt.Errorf("%d of %d bytes: %w", n, end-start, err)
		if ctx.Err() != nil {
			break
		}
	}
	if errors.Is(lastErr, io.EOF) {
		lastErr = io.ErrUnexpectedEOF
	}
	return nil, f.s.c.storeError(fmt.Sprintf("read %s bytes %d-%d", f.name, start, end-1), lastErr)
}

// readahead notes a read of [off, end), whose last chunk is hi-1: a read
// that continues the previous one starts fetching the readaheadChunks
// after it that are not at hand.
func (f *file) readahead(off, end, hi int64) {
	f.mu.Lock()
	seq := f.last >= 0 && off >= f.last-readChunk && off <= f.last+readChunk
	f.last = end
	if !seq {
		f.raNext = hi
		f.mu.Unlock()
		return
	}
	from := max(hi, f.raNext)
	to := min(hi+readaheadChunks, (f.obj.size+readChunk-1)/readChunk)
	if from >= to || from > hi+readaheadChunks/2 {
		f.mu.Unlock()
		return // far enough ahead already
	}
	f.raNext = to
	f.mu.Unlock()
	var want []int64
	for i := from; i < to; i++ {
		if f.s.mem.Contains(chunkKey{f.name, i}) {
			continue
		}
		want = append(want, i)
	}
	if len(want) > 0 {
		f.fetchChunks(f.ctx, want, false)
	}
}
