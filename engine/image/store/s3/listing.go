package s3

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/lazyfs/lazyfs/engine/image/store/cache"
)

// snapshotID is the identity of the snapshot c addresses in the cache
// directory: its listing and its local directory are named by it.
func (c *client) snapshotID() string {
	return fmt.Sprintf("%s\x00%s\x00%s", c.endpoint, c.addr.Bucket, c.addr.listPrefix())
}

// objectID is the identity of a version of the object key in the cache
// directory: its chunks are named by it, so that an object replaced
// (another ETag or size) never reads the chunks of the one before.
func (c *client) objectID(key string, o object) string {
	return fmt.Sprintf("%s\x00%s\x00%s\x00%s\x00%d", c.endpoint, c.addr.Bucket, key, o.etag, o.size)
}

// keptListing is the listing kept in the cache directory: the objects of
// one snapshot, by name, with their size and ETag, as the store listed
// them, so that a restore whose chunks are all cached works with the
// store unreachable.
type keptListing struct {
	Listed  time.Time
	Objects map[string]keptObject
}

type keptObject struct {
	Size int64
	ETag string
}

// putListing keeps the listing of the snapshot cl addresses.
func putListing(d *cache.Dir, cl *client, objs map[string]object) {
	k := keptListing{Listed: time.Now().UTC(), Objects: map[string]keptObject{}}
	for name, o := range objs {
		k.Objects[name] = keptObject{o.size, o.etag}
	}
	b, err := json.Marshal(k)
	if err != nil {
		return
	}
	d.PutListing(cl.snapshotID(), b)
}

// listing returns the kept listing of the snapshot cl addresses, and
// when it was listed.
func listing(d *cache.Dir, cl *client) (map[string]object, time.Time, bool) {
	b, ok := d.Listing(cl.snapshotID())
	if !ok {
		return nil, time.Time{}, false
	}
	var k keptListing
	if json.Unmarshal(b, &k) != nil || k.Objects == nil {
		return nil, time.Time{}, false
	}
	out := map[string]object{}
	for name, o := range k.Objects {
		out[name] = object{size: o.Size, etag: o.ETag}
	}
	return out, k.Listed, true
}
