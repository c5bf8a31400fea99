package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/store/cache"
)

const (
	// readChunk is the unit of a ranged read: aligned, cached whole.
	readChunk = 1 << 20
	// maxGet bounds the bytes of one GET (neighbouring chunks coalesced).
	maxGet = 8 << 20
	// maxInFlight bounds the GETs of one store at once.
	maxInFlight = 8
	// DefaultReadTimeout bounds one read of the store, every attempt and
	// wait included (--s3-read-timeout); retryWait is the first wait
	// between attempts, doubled up to maxBackoff, each jittered.
	DefaultReadTimeout = 30 * time.Second
	retryWait          = 250 * time.Millisecond
	// attemptTimeout bounds one attempt of a GET of at most maxGet bytes,
	// its body included.
	attemptTimeout = 10 * time.Second
	// stallWarnEvery is how often a read that waits says so.
	stallWarnEvery = 5 * time.Second
	// readaheadChunks is how far ahead of a sequential reader chunks are
	// fetched.
	readaheadChunks = 16
)

// chunkKey names a chunk of an object in the memory cache.
type chunkKey struct {
	name string
	idx  int64
}

// file is one object opened for ranged reads: a store.File.
type file struct {
	s         *Store
	closeOnce sync.Once // lets go of disk
	name      string
	key       string
	id        string // the object's in the cache directory (client.objectID)
	obj       object
	// disk is the store's disk cache, or nil; diskRead says whether
	// chunks are read from it (the manifest's only offline), not only
	// put there.
	disk     *cache.Dir
	diskRead bool

	mu       sync.Mutex
	inFlight map[int64]*fetch // chunks being fetched
	// forgets counts Forget calls: a fetch begun before one may bring
	// the bytes it dropped (read from the disk cache before the drop),
	// so it is not kept in memory.
	forgets uint64
	last    int64 // end of the previous read, for readahead
	raNext  int64 // first chunk not yet asked ahead

	ctx    context.Context // readahead's, cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// fetch is one GET of chunks [lo, hi) that readers of those chunks wait
// for.
type fetch struct {
	lo, hi  int64
	forgets uint64 // file.forgets when it began
	done    chan struct{}
	data    [][]byte // a buffer per chunk: the memory cache keeps them one by one
	err     error
}

func newFile(s *Store, name string, o object) *file {
	ctx, cancel := context.WithCancel(s.ctx)
	key := s.c.addr.key(name)
	f := &file{s: s, name: name, key: key, id: s.c.objectID(key, o), obj: o, inFlight: map[int64]*fetch{}, last: -1, ctx: ctx, cancel: cancel}
	if s.disk != nil && s.disk.Retain() {
		f.disk = s.disk
	}
	// The manifest is read from the store whenever it can be reached:
	// it says what every other byte must be. It is kept in the cache
	// for when the store cannot be.
	f.diskRead = f.disk != nil && (name != image.ManifestName || s.offline)
	return f
}

// Close stops the file's readahead and lets go of the cache directory.
func (f *file) Close() error {
	f.cancel()
	f.wg.Wait()
	f.closeOnce.Do(func() {
		if f.disk != nil {
			f.disk.Unref()
		}
	})
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
		got, err := f.fetchChunks(f.s.ctx, missing, true)
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

// Forget drops the chunks of [off, off+n) from memory and from the disk
// cache (image.Forgetter): the reader found a block there that fails its
// check, and the store may hold a good copy. It reports whether a chunk
// was kept anywhere.
func (f *file) Forget(off, n int64) bool {
	if n <= 0 || off < 0 || off >= f.obj.size {
		return false
	}
	end := min(off+n, f.obj.size)
	held := false
	// A fetch of these chunks under way may be bringing the copy being
	// dropped: readers from now on start one of their own, and what it
	// brings is not kept (current).
	f.mu.Lock()
	f.forgets++
	for i := off / readChunk; i < (end-1)/readChunk+1; i++ {
		if _, ok := f.inFlight[i]; ok {
			delete(f.inFlight, i)
			held = true
		}
	}
	f.mu.Unlock()
	for i := off / readChunk; i < (end-1)/readChunk+1; i++ {
		held = f.s.mem.Remove(chunkKey{f.name, i}) || held
		if f.disk != nil {
			held = f.disk.Drop(f.id, i) || held
		}
	}
	return held
}

// current tells whether no Forget came since fetch c began: only then
// may what it read from the disk cache be kept in memory.
func (f *file) current(c *fetch) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return c.forgets == f.forgets
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
		c := &fetch{lo: idx[i], hi: idx[j-1] + 1, forgets: f.forgets, done: make(chan struct{})}
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
	fromDisk := false
	if f.disk != nil {
		c.data, fromDisk, c.err = f.disk.ReadThrough(f.id, c.lo, c.hi, f.chunkLen, f.diskRead, func() ([][]byte, error) {
			return f.getChunks(ctx, c.lo, c.hi)
		})
	} else {
		c.data, c.err = f.getChunks(ctx, c.lo, c.hi)
	}
	if c.err != nil {
		return
	}
	// Chunks from the store are good even if a Forget came meanwhile;
	// chunks from the disk cache are kept in memory only if none did.
	if fromDisk && !f.current(c) {
		return
	}
	for i, b := range c.data {
		f.s.mem.Add(chunkKey{f.name, c.lo + int64(i)}, b)
	}
}

// getChunks reads chunks [lo, hi) of the object with one ranged GET,
// refusing an object whose ETag is no longer the one listed. The whole
// read, every attempt and wait included, ends within the store's read
// timeout (--s3-read-timeout): an answer that may pass (the store cannot
// be reached, a 5xx, SlowDown, RequestTimeout, throttling, a body cut
// short, an attempt with no answer in attemptTimeout) is tried again
// after a jittered, growing wait; any other answer (no such key, access
// denied, an object replaced) ends it at once. While it waits, a warning
// every stallWarnEvery names the object and the store's last answer; when
// it gives up, the error does too.
func (f *file) getChunks(ctx context.Context, lo, hi int64) ([][]byte, error) {
	start, end := lo*readChunk, min(f.obj.size, hi*readChunk)
	what := fmt.Sprintf("read %s bytes %d-%d", f.name, start, end-1)
	first := time.Now()
	deadline := first.Add(f.s.readTimeout)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	in := &s3.GetObjectInput{
		Bucket:  aws.String(f.s.c.addr.Bucket),
		Key:     aws.String(f.key),
		Range:   aws.String(fmt.Sprintf("bytes=%d-%d", start, end-1)),
		IfMatch: aws.String(f.obj.etag),
	}
	var last lastAnswer
	stop := f.warnWhileWaiting(what, first, &last)
	defer stop()
	wait := retryWait
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			d := jitter(wait)
			if time.Now().Add(d).After(deadline) {
				break
			}
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
			if ctx.Err() != nil {
				break
			}
			wait = min(2*wait, maxBackoff)
		}
		began := time.Now()
		bufs, err := f.getOnce(ctx, in, lo, hi, start, end)
		if err == nil {
			return bufs, nil
		}
		if errors.Is(err, context.DeadlineExceeded) {
			// The attempt's own bound or the read's: no answer.
			err = fmt.Errorf("no answer in %v (attempt %d)", time.Since(began).Round(time.Millisecond), attempt+1)
		}
		last.set(err)
		if !retryable(err) || ctx.Err() != nil {
			break
		}
	}
	err := last.get()
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		return nil, fmt.Errorf("%s: %s: %w", f.path(), what, ctx.Err())
	case !retryable(err):
		return nil, f.s.c.storeError(what, err)
	}
	return nil, f.s.c.storeError(what, fmt.Errorf("%w after %v (--s3-read-timeout %v); the store's last answer: %w",
		errGaveUp, time.Since(first).Round(time.Millisecond), f.s.readTimeout, err))
}

// errGaveUp marks a read that gave up at the read timeout.
var errGaveUp = errors.New("gave up")

// getOnce is one attempt of a ranged GET, bounded by attemptTimeout (its
// body too: a store that stalls mid-body is given up on, not waited for).
func (f *file) getOnce(ctx context.Context, in *s3.GetObjectInput, lo, hi, start, end int64) ([][]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	out, err := f.s.c.s3.GetObject(ctx, in, func(o *s3.Options) { o.RetryMaxAttempts = 1 })
	if err != nil {
		return nil, err
	}
	defer out.Body.Close()
	// A store that ignores Range answers 200 with the whole object: its
	// bytes are not the ones asked for.
	want := fmt.Sprintf("bytes %d-%d/%d", start, end-1, f.obj.size)
	if got := aws.ToString(out.ContentRange); got != want {
		return nil, fmt.Errorf("%w: asked bytes=%d-%d, answered Content-Range %q", errRangeIgnored, start, end-1, got)
	}
	bufs := make([][]byte, hi-lo)
	var n int64
	for i := range bufs {
		bufs[i] = make([]byte, f.chunkLen(lo+int64(i)))
		m, err := io.ReadFull(out.Body, bufs[i])
		n += int64(m)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			if ctx.Err() != nil {
				err = fmt.Errorf("%w (%w)", err, ctx.Err())
			}
			return nil, fmt.Errorf("body cut short: %d of %d bytes: %w", n, end-start, err)
		}
	}
	return bufs, nil
}

// errRangeIgnored marks an answer to a ranged GET that is not the range.
var errRangeIgnored = errors.New("the store ignored the Range of a GET")

// retryable reports whether an attempt's error may pass if tried again:
// no answer (a connection refused or reset, an attempt that timed out, a
// body cut short), a 5xx, 408 or 429, or an error code that says the store
// is busy.
func retryable(err error) bool {
	if errors.Is(err, errRangeIgnored) {
		return false
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		if s := re.HTTPStatusCode(); s >= 500 || s == http.StatusTooManyRequests || s == http.StatusRequestTimeout {
			return true
		}
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling",
			"ThrottlingException", "ThrottledException", "RequestThrottled", "TooManyRequests",
			"TooManyRequestsException", "RequestLimitExceeded", "BandwidthLimitExceeded":
			return true
		}
		return false
	}
	return true
}

// jitter returns a wait between d/2 and d.
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}

// lastAnswer is the store's last answer to a read, for the warnings
// printed while it waits and the error if it gives up.
type lastAnswer struct {
	mu  sync.Mutex
	err error
}

func (l *lastAnswer) set(err error) { l.mu.Lock(); l.err = err; l.mu.Unlock() }

func (l *lastAnswer) get() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		return errors.New("none yet")
	}
	return l.err
}

// warnWhileWaiting logs a warning every stallWarnEvery until the returned
// function is called: the store has not answered the read what yet.
func (f *file) warnWhileWaiting(what string, since time.Time, last *lastAnswer) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(stallWarnEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				slog.Warn("the object store is slow to answer", "store", f.s.c.addr.String(), "endpoint", f.s.c.endpoint,
					"read", what, "waiting", now.Sub(since).Round(time.Second), "gives up after", f.s.readTimeout,
					"last answer", last.get().Error())
			}
		}
	}()
	return func() { close(done) }
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
