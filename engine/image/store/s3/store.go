// Package s3 keeps snapshots in an S3-compatible object store (AWS
// S3, MinIO, Ceph RGW, R2): the store.Store and store.StoreWriter of the
// addresses s3://BUCKET/PREFIX, registered with store.RegisterScheme by
// importing this package. A snapshot is the objects PREFIX/snapshot.json,
// PREFIX/pages-PID.img... named as the files of a snapshot directory.
//
// # Configuration
//
// The endpoint, region and credentials are found as the AWS tools find
// them (the AWS SDK for Go v2's default chain): AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_PROFILE,
// AWS_ENDPOINT_URL(_S3), ~/.aws/credentials and ~/.aws/config, then the
// instance's role. store.Options.Endpoint (--s3-endpoint) overrides
// the endpoint; any endpoint but AWS's is addressed path-style
// (ENDPOINT/BUCKET/KEY), as MinIO and most S3-compatible stores want. A
// store without a region is asked as us-east-1.
//
// # Reading
//
// An object is read by ranged GETs of whole chunks (readChunk, 1 MiB,
// aligned): the chunks a read needs that are not at hand are fetched with
// one GET for each run of neighbours, several GETs in parallel but at most
// maxInFlight per store; a read that continues the previous one fetches
// the chunks after it ahead of time. Chunks are kept in memory (an LRU,
// memChunks per store), and, with a cache directory, on disk across runs
// with a CRC32C each, checked whenever a chunk is reused (cache.Dir). The
// listing and the manifest are kept there too: a Store opened while the
// store cannot be reached works from the cache directory alone.
// Every GET names the object's ETag as the store listed it (If-Match), so
// that an object replaced since the snapshot was opened fails its reads
// rather than mix two snapshots, and its answer must be the range asked
// (206 with that Content-Range). A GET that fails in a way that may pass
// (no answer, a 5xx, SlowDown, throttling, a body cut short, an attempt
// of more than attemptTimeout) is tried again after a jittered, growing
// wait, within one read timeout for the whole read (DefaultReadTimeout,
// --s3-read-timeout), with a warning every stallWarnEvery while it
// waits; then the read fails, naming the store's last answer: its caller
// (a lazyfs mount, a restore) gets an error, never other bytes. Every
// read ends at once when the Store's context (the command's) is done. The bytes themselves are
// checked by the format's readers (the manifest's CRC32C of every small
// file, every block's CRC32C).
//
// # Writing
//
// A dump refuses a PREFIX that holds any object, and marks it with a lock
// object (lockName, created only if absent) until it commits. Files are
// uploaded as they are written: small ones with one PUT, the pages file
// as a multipart upload whose parts (partSize) go up in parallel
// (maxPartsInFlight) while the dump goes on, each with its CRC32C for the
// store to check. The manifest is written last, only if absent, then the
// lock removed. A dump that fails aborts its uploads and removes what it
// wrote.
//
// # Request log
//
// LAZYFS_S3_TRACE=FILE appends one line per HTTP request to FILE (method,
// path, range, status), for tests and for whoever wonders what a restore
// fetched; processes started by the one that has it set (the private
// mount's helper) inherit it.
package s3

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/lazyfs/lazyfs/engine/image/store/cache"
	"github.com/lazyfs/lazyfs/engine/image/store/trace"

	"github.com/lazyfs/lazyfs/engine/image/store"
)

// Scheme is the address scheme of this store: s3://BUCKET/PREFIX.
const Scheme = "s3"

func init() {
	store.RegisterScheme(Scheme, store.Scheme{
		Open:   func(addr string, o store.Options) (store.Store, error) { return Open(addr, o) },
		Create: func(addr string, o store.Options) (store.StoreWriter, error) { return Create(addr, o) },
	})
}

const (
	// maxAttempts is how many times one request is tried.
	maxAttempts = 4
	// maxBackoff bounds the wait between two attempts.
	maxBackoff = 2 * time.Second
	// opTimeout bounds the other requests (LIST, PUT of small objects,
	// a part...).
	opTimeout = 2 * time.Minute
	// dialTimeout bounds a connection's setup.
	dialTimeout = 5 * time.Second
)

// ErrAddress: an address that is not s3://BUCKET[/PREFIX].
var ErrAddress = errors.New("not an s3://BUCKET/PREFIX address")

// Address is a parsed s3://BUCKET/PREFIX.
type Address struct {
	Bucket string
	Prefix string // without a trailing slash; may be empty
}

// ParseAddress parses s3://BUCKET[/PREFIX].
func ParseAddress(addr string) (Address, error) {
	rest, ok := strings.CutPrefix(addr, Scheme+"://")
	if !ok {
		return Address{}, fmt.Errorf("%q: %w", addr, ErrAddress)
	}
	bucket, prefix, _ := strings.Cut(rest, "/")
	prefix = strings.Trim(prefix, "/")
	if bucket == "" {
		return Address{}, fmt.Errorf("%q: %w: no bucket", addr, ErrAddress)
	}
	for _, part := range strings.Split(prefix, "/") {
		if part == "." || part == ".." || (prefix != "" && part == "") {
			return Address{}, fmt.Errorf("%q: %w: empty, . or .. in the prefix", addr, ErrAddress)
		}
	}
	return Address{Bucket: bucket, Prefix: prefix}, nil
}

func (a Address) String() string {
	if a.Prefix == "" {
		return Scheme + "://" + a.Bucket
	}
	return Scheme + "://" + a.Bucket + "/" + a.Prefix
}

// key returns the object key of the snapshot's file name.
func (a Address) key(name string) string {
	if a.Prefix == "" {
		return name
	}
	return a.Prefix + "/" + name
}

// listPrefix is what every key of the snapshot starts with.
func (a Address) listPrefix() string {
	if a.Prefix == "" {
		return ""
	}
	return a.Prefix + "/"
}

// client is an S3 client and what its requests share.
type client struct {
	s3       *s3.Client
	addr     Address
	endpoint string // for messages and cache keys
}

// newClient makes the client for addr from the environment and o.
func newClient(ctx context.Context, addr Address, o store.Options) (*client, error) {
	// The SDK's own client, so that AWS_CA_BUNDLE and the like still
	// apply to it.
	hc := awshttp.NewBuildableClient().WithDialerOptions(func(d *net.Dialer) {
		d.Timeout = dialTimeout
	}).WithTransportOptions(func(tr *http.Transport) {
		tr.MaxIdleConnsPerHost = 2 * maxInFlight
		tr.ResponseHeaderTimeout = attemptTimeout
	})
	cfg, err := config.LoadDefaultConfig(ctx,
		config.WithHTTPClient(hc),
		config.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(so *retry.StandardOptions) {
				so.MaxAttempts = maxAttempts
				so.MaxBackoff = maxBackoff
				so.RateLimiter = ratelimit.None // a restore keeps retrying for as long as it runs
			})
		}))
	if err != nil {
		return nil, fmt.Errorf("%s: AWS configuration: %w", addr, err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	c := &client{addr: addr}
	c.s3 = s3.NewFromConfig(cfg, func(so *s3.Options) {
		if o.Endpoint != "" {
			so.BaseEndpoint = aws.String(o.Endpoint)
		}
		if so.BaseEndpoint != nil {
			so.UsePathStyle = true
			c.endpoint = *so.BaseEndpoint
		}
		// Checksums are ours: CRC32C of every part and small object,
		// sent for the store to check (see upload).
		so.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		so.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
		if path := os.Getenv("LAZYFS_S3_TRACE"); path != "" {
			so.HTTPClient = &trace.Client{Next: so.HTTPClient, Path: path}
		}
	})
	if c.endpoint == "" {
		c.endpoint = "aws:" + cfg.Region
	}
	return c, nil
}

// storeError words an error of a request on the object store, so that
// the commands map it to their exit statuses: credentials the store
// refuses match os.ErrPermission, a missing bucket os.ErrNotExist.
func (c *client) storeError(op string, err error) error {
	where := fmt.Sprintf("%s (endpoint %s)", c.addr, c.endpoint)
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "NoSuchBucket":
			return fmt.Errorf("%s: %s: bucket %q does not exist: %w", where, op, c.addr.Bucket, os.ErrNotExist)
		case "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken", "InvalidClientTokenId", "Forbidden":
			return fmt.Errorf("%s: %s: the store refused the credentials (%s: %s): %w", where, op, ae.ErrorCode(), ae.ErrorMessage(), os.ErrPermission)
		}
		return fmt.Errorf("%s: %s: %s: %s", where, op, ae.ErrorCode(), ae.ErrorMessage())
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %s: no answer in time: %w", where, op, err)
	}
	return fmt.Errorf("%s: %s: %w", where, op, err)
}

// object is what a listing says of one object.
type object struct {
	size     int64
	etag     string
	modified time.Time
}

// list returns the objects right under the address's prefix, by file
// name (at most limit of them if limit > 0).
func (c *client) list(ctx context.Context, limit int) (map[string]object, error) {
	return c.listWith(ctx, limit, nil)
}

// listWith is list; raw, if not nil, receives a failed request's own
// error.
func (c *client) listWith(ctx context.Context, limit int, raw *error) (map[string]object, error) {
	out := map[string]object{}
	in := &s3.ListObjectsV2Input{Bucket: aws.String(c.addr.Bucket), Prefix: aws.String(c.addr.listPrefix()), Delimiter: aws.String("/")}
	if limit > 0 {
		in.MaxKeys = aws.Int32(int32(limit))
	}
	p := s3.NewListObjectsV2Paginator(c.s3, in)
	for p.HasMorePages() {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		page, err := p.NextPage(octx)
		cancel()
		if err != nil {
			if raw != nil {
				*raw = err
			}
			return nil, c.storeError("list objects", err)
		}
		for _, o := range page.Contents {
			name := strings.TrimPrefix(aws.ToString(o.Key), c.addr.listPrefix())
			out[name] = object{size: aws.ToInt64(o.Size), etag: aws.ToString(o.ETag), modified: aws.ToTime(o.LastModified)}
		}
		if limit > 0 && len(out) >= limit {
			break
		}
	}
	return out, nil
}

// Store is a snapshot in an object store, opened for reading: an
// store.Store.
type Store struct {
	c       *client
	objects map[string]object // listed once, by Open
	mem     *lru.Cache[chunkKey, []byte]
	disk    *cache.Dir // nil without a cache directory
	// closeOnce lets go of disk once, however often Close is called.
	closeOnce sync.Once
	sem       chan struct{}
	// ctx ends every read when it is done (store.Options.Context: the
	// command's, cancelled by SIGINT and SIGTERM).
	ctx         context.Context
	readTimeout time.Duration
	// offline: the store could not be reached at Open, and the listing
	// is the one kept in the cache directory; the manifest is then read
	// from the cache too.
	offline bool
	// side is the local directory of the snapshot's working sets
	// (LocalDir), opened once.
	sideOnce sync.Once
	side     *os.File
	sideErr  error
}

// memChunks is how many chunks a Store keeps in memory.
const memChunks = 64

// Open opens the snapshot at addr (s3://BUCKET/PREFIX) for reading: one
// listing of its objects. A missing bucket fails here, as do credentials
// the store refuses; a missing manifest fails image.OpenWith
// (image.ErrIncomplete), as for a directory.
func Open(addr string, o store.Options) (*Store, error) {
	a, err := ParseAddress(addr)
	if err != nil {
		return nil, err
	}
	ctx := o.Context
	if ctx == nil {
		ctx = context.Background()
	}
	c, err := newClient(ctx, a, o)
	if err != nil {
		return nil, err
	}
	mem, _ := lru.New[chunkKey, []byte](memChunks)
	s := &Store{c: c, mem: mem, sem: make(chan struct{}, maxInFlight), ctx: ctx, readTimeout: o.ReadTimeout}
	if s.readTimeout <= 0 {
		s.readTimeout = DefaultReadTimeout
	}
	if o.CacheDir != "" {
		if s.disk, err = cache.Open(o.CacheDir, o.CacheSize, o.Trust); err != nil {
			return nil, err
		}
	}
	objs, raw, err := c.listRaw(ctx)
	switch {
	case err == nil:
		s.objects = objs
		if s.disk != nil {
			putListing(s.disk, c, objs)
		}
	case s.disk != nil && unreachable(raw):
		// Offline: the listing kept with the chunks, if there is one.
		// Every chunk read from the cache is still checked, and the
		// manifest (kept too) says what every other byte must be.
		kept, at, ok := listing(s.disk, c)
		if !ok {
			s.Close()
			return nil, err
		}
		slog.Warn("the object store cannot be reached: using the listing kept in the cache directory", "store", a.String(),
			"endpoint", c.endpoint, "listed", at.Format(time.RFC3339), "err", err)
		s.objects, s.offline = kept, true
	default:
		s.Close()
		return nil, err
	}
	return s, nil
}

// listRaw is list(ctx, 0) that also returns the request's own error,
// before storeError words it, for unreachable.
func (c *client) listRaw(ctx context.Context) (map[string]object, error, error) {
	var raw error
	objs, err := c.listWith(ctx, 0, &raw)
	return objs, raw, err
}

// unreachable reports whether a request failed for want of an answer (no
// connection, no answer in time), rather than by the store's refusal.
func unreachable(err error) bool {
	var ae smithy.APIError
	return !errors.As(err, &ae) && !errors.Is(err, context.Canceled)
}

func (s *Store) String() string { return s.c.addr.String() }

// Stat returns the size of the object of name, as listed by Open.
func (s *Store) Stat(name string) (int64, error) {
	o, ok := s.objects[name]
	if !ok {
		return 0, &os.PathError{Op: "stat", Path: s.c.addr.String() + "/" + name, Err: os.ErrNotExist}
	}
	return o.size, nil
}

// Open opens the object of name for ranged reads.
func (s *Store) Open(name string) (store.File, error) {
	o, ok := s.objects[name]
	if !ok {
		return nil, &os.PathError{Op: "open", Path: s.c.addr.String() + "/" + name, Err: os.ErrNotExist}
	}
	return newFile(s, name, o), nil
}

// Close lets go of the cache directory, if any, which is closed with the
// last file opened from the store: files stay usable after the store is
// closed; each stops its own readahead when closed.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		if s.side != nil {
			s.side.Close()
		}
		if s.disk != nil {
			s.disk.Unref()
		}
	})
	return nil
}
