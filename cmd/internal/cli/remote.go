package cli

import (
	"context"
	"time"

	"github.com/lazyfs/lazyfs/engine/image/store"
	"github.com/lazyfs/lazyfs/engine/image/store/cache"
	// An archive (snapctl export) wherever a snapshot directory is accepted.
	_ "github.com/lazyfs/lazyfs/engine/image/store/archive"
	// s3://BUCKET/PREFIX wherever a snapshot directory is accepted.
	"github.com/lazyfs/lazyfs/engine/image/store/s3"
)

// Remote is the flags of a snapshot in an object store: --s3-endpoint,
// and for the commands that read one, --cache-dir and --cache-dir-size.
type Remote struct {
	endpoint    *string
	cacheDir    *string
	cacheSize   *Size
	readTimeout *time.Duration
}

// RemoteFlags adds the flags of a snapshot given as s3://BUCKET/PREFIX to
// f; withCache adds the cache directory's (for the commands that read).
func RemoteFlags(f *FlagSet, withCache bool) *Remote {
	r := &Remote{endpoint: f.String("s3-endpoint", "", "with -D s3://BUCKET/PREFIX: the object store's `URL` (http://127.0.0.1:9000 for a MinIO); by default AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, ~/.aws/config, else AWS S3 itself. Credentials and region come from AWS_* variables and ~/.aws/credentials and config, as for the AWS tools")}
	r.readTimeout = f.Duration("s3-read-timeout", s3.DefaultReadTimeout, "with a snapshot at s3://: give up a read of the store after `DURATION`, every retry included (a store that cannot be reached, answers 5xx or SlowDown, or throttles is asked again after a jittered, growing wait; a warning every 5 s says what it waits for)")
	if withCache {
		r.cacheDir = f.String("cache-dir", "", "with a snapshot at s3://: keep the blocks fetched in `DIR` (created 0700; yours, writable by nobody else), checked by CRC32C when reused, so that the next restore or mount on this host fetches nothing it already has")
		r.cacheSize = f.Size("cache-dir-size", cache.DefaultSize, "bound --cache-dir to `SIZE`, the blocks used least recently going first")
	}
	return r
}

// Options returns the flags as store.Options; ctx (the command's)
// ends every read of the store when it is done.
func (r *Remote) Options(ctx context.Context) store.Options {
	o := store.Options{Endpoint: *r.endpoint, ReadTimeout: *r.readTimeout, Context: ctx}
	if r.cacheDir != nil {
		o.CacheDir, o.CacheSize = *r.cacheDir, r.cacheSize.V
	}
	return o
}

// Check refuses the flags with a snapshot that is a directory.
func (r *Remote) Check(dir string) error {
	if store.IsRemote(dir) {
		return nil
	}
	if *r.endpoint != "" {
		return Usagef("--s3-endpoint goes with a snapshot at s3://BUCKET/PREFIX")
	}
	if r.cacheDir != nil && *r.cacheDir != "" {
		return Usagef("--cache-dir goes with a snapshot at s3://BUCKET/PREFIX")
	}
	return nil
}
