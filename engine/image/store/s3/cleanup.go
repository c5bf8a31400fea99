package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

// ErrLockHeld: cleanup refused a prefix whose lock is of a dump that runs,
// or may run (on another host) and --force was not given.
var ErrLockHeld = errors.New("the dump that holds the lock may be running")

// Leftovers is what a dump that did not finish left under a prefix: its
// lock, the objects it wrote (when there is no manifest: the snapshot was
// never committed) and multipart uploads never completed or aborted,
// which a store keeps, and bills, until they are aborted.
type Leftovers struct {
	Addr Address
	// Lock is the dump's lock; nil if the prefix has none.
	Lock *Lock
	// Complete: the prefix holds a manifest, a whole snapshot: only the
	// lock (a dump killed as it committed) and uploads are leftovers.
	Complete bool
	// Objects are the dead dump's objects, by name: every object of a
	// locked prefix without a manifest.
	Objects []Object
	// Others are objects that are not a dump's leftovers (no lock marks
	// the prefix): listed, never removed.
	Others []Object
	// Uploads are the dump's multipart uploads never completed nor
	// aborted: those its markers name, and, under a dead dump's lock,
	// those the store lists under the prefix.
	Uploads []PendingUpload
	// OtherUploads are uploads under the prefix that no marker or lock
	// says are a dump's: listed, never aborted.
	OtherUploads []PendingUpload
	// Markers are the objects that name a dump's uploads; Stale those
	// of them whose upload is gone (completed, or aborted already).
	Markers []string
	Stale   []string

	c *client
}

// Object is an object of a prefix.
type Object struct {
	Name string
	Size int64
}

// PendingUpload is a multipart upload never completed nor aborted.
type PendingUpload struct {
	Name      string
	ID        string
	Initiated time.Time
}

// Empty says there is nothing to clear.
func (l *Leftovers) Empty() bool {
	return l.Lock == nil && len(l.Objects) == 0 && len(l.Uploads) == 0 && len(l.Markers) == 0
}

// FindLeftovers lists what a dump that did not finish left at addr.
func FindLeftovers(ctx context.Context, addr string, o store.Options) (*Leftovers, error) {
	a, err := ParseAddress(addr)
	if err != nil {
		return nil, err
	}
	c, err := newClient(ctx, a, o)
	if err != nil {
		return nil, err
	}
	objs, err := c.list(ctx, 0)
	if err != nil {
		return nil, err
	}
	l := &Leftovers{Addr: a, c: c}
	if _, ok := objs[lockName]; ok {
		lk, found, err := c.readLock(ctx)
		if err != nil {
			return nil, err
		}
		if found {
			l.Lock = &lk
		}
	}
	_, l.Complete = objs[image.ManifestName]
	ids := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(objs)) {
		ob := Object{Name: name, Size: objs[name].size}
		switch {
		case name == lockName:
		case strings.HasPrefix(name, uploadMarker):
			if err := l.addMarker(ctx, name, ids); err != nil {
				return nil, err
			}
		case l.Complete:
		case l.Lock != nil:
			l.Objects = append(l.Objects, ob)
		default:
			l.Others = append(l.Others, ob)
		}
	}
	// Uploads with no marker, where the store lists uploads by prefix:
	// a dead dump's (killed between starting one and marking it) when its
	// lock says so; otherwise someone else's, listed and kept.
	listed, err := c.pendingUploads(ctx, c.addr.listPrefix())
	if err != nil {
		return nil, err
	}
	for _, u := range listed {
		if ids[u.ID] {
			continue
		}
		ids[u.ID] = true
		if l.Lock != nil && !l.Complete {
			l.Uploads = append(l.Uploads, u)
		} else {
			l.OtherUploads = append(l.OtherUploads, u)
		}
	}
	return l, nil
}

// addMarker adds the upload marker name to l: a dump's own, whatever
// else the prefix holds. Its upload is looked up by its exact key, which
// every store lists: a marker whose upload is gone (completed, its
// marker's delete failed) is stale, removed with nothing to abort. ids
// are the uploads found so far.
func (l *Leftovers) addMarker(ctx context.Context, name string, ids map[string]bool) error {
	l.Markers = append(l.Markers, name)
	id, _, err := l.c.readSmall(ctx, name)
	if err != nil {
		return err
	}
	file := strings.TrimPrefix(name, uploadMarker)
	of, err := l.c.pendingUploadsOf(ctx, l.c.addr.key(file))
	if err != nil {
		return err
	}
	found := false
	for _, u := range of {
		if u.ID == strings.TrimSpace(id) && !ids[u.ID] {
			ids[u.ID] = true
			l.Uploads = append(l.Uploads, u)
			found = true
		}
	}
	if !found {
		l.Stale = append(l.Stale, name)
	}
	return nil
}

// pendingUploadsOf lists the multipart uploads of the object key.
func (c *client) pendingUploadsOf(ctx context.Context, key string) ([]PendingUpload, error) {
	us, err := c.pendingUploads(ctx, key)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(us, func(u PendingUpload) bool { return c.addr.key(u.Name) != key }), nil
}

// readSmall reads the object name, a few bytes of text (a lock, a
// marker); found is false if there is no such object.
func (c *client) readSmall(ctx context.Context, name string) (text string, found bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	out, err := c.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(c.addr.Bucket), Key: aws.String(c.addr.key(name))})
	if err != nil {
		if notFound(err) {
			return "", false, nil
		}
		return "", false, c.storeError("read "+name, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(io.LimitReader(out.Body, 4096))
	if err != nil {
		return "", true, c.storeError("read "+name, err)
	}
	return string(b), true, nil
}

// pendingUploads lists the multipart uploads whose keys start with
// prefix, right under the snapshot's prefix.
func (c *client) pendingUploads(ctx context.Context, prefix string) ([]PendingUpload, error) {
	var out []PendingUpload
	in := &s3.ListMultipartUploadsInput{Bucket: aws.String(c.addr.Bucket), Prefix: aws.String(prefix), Delimiter: aws.String("/")}
	for {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		page, err := c.s3.ListMultipartUploads(octx, in)
		cancel()
		if err != nil {
			return nil, c.storeError("list multipart uploads", err)
		}
		for _, u := range page.Uploads {
			name := strings.TrimPrefix(aws.ToString(u.Key), c.addr.listPrefix())
			out = append(out, PendingUpload{Name: name, ID: aws.ToString(u.UploadId), Initiated: aws.ToTime(u.Initiated)})
		}
		if !aws.ToBool(page.IsTruncated) {
			break
		}
		in.KeyMarker, in.UploadIdMarker = page.NextKeyMarker, page.NextUploadIdMarker
	}
	slices.SortFunc(out, func(a, b PendingUpload) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Clear aborts the uploads, removes the dead dump's objects and then its
// lock, calling report for each as it goes. It refuses (ErrLockHeld) a
// lock whose dump runs on this host and, unless force, one whose dump ran
// on another host or says too little to tell.
func (l *Leftovers) Clear(ctx context.Context, force bool, report func(what string)) error {
	// The lock once more, just before acting: a dump that took the
	// prefix since it was listed is not cleared away.
	now, found, err := l.c.readLock(ctx)
	if err != nil {
		return err
	}
	if found != (l.Lock != nil) || found && now != *l.Lock {
		return fmt.Errorf("%s: %w: a dump took or left the prefix since it was listed: run cleanup again", l.Addr, ErrLockHeld)
	}
	if l.Lock != nil {
		switch st := l.Lock.State(); {
		case st == LockRunning:
			return fmt.Errorf("%s: %w: %s, which is running: let it finish or stop it", l.Addr, ErrLockHeld, l.Lock.describe())
		case st == LockUnknown && !force:
			return fmt.Errorf("%s: %w: %s, which this host cannot tell is gone: make sure it no longer runs, then clear with --force", l.Addr, ErrLockHeld, l.Lock.describe())
		}
	}
	for _, u := range l.Uploads {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		_, err := l.c.s3.AbortMultipartUpload(octx, &s3.AbortMultipartUploadInput{Bucket: aws.String(l.Addr.Bucket), Key: aws.String(l.Addr.key(u.Name)), UploadId: aws.String(u.ID)})
		cancel()
		if err != nil && !noSuchUpload(err) {
			return l.c.storeError("abort the upload of "+u.Name, err)
		}
		report("aborted the upload of " + u.Name)
	}
	for _, m := range l.Markers {
		if err := l.c.remove(ctx, m); err != nil {
			return err
		}
	}
	for _, o := range l.Objects {
		if err := l.c.remove(ctx, o.Name); err != nil {
			return err
		}
		report("removed " + o.Name)
	}
	if l.Lock != nil {
		if err := l.c.remove(ctx, lockName); err != nil {
			return err
		}
		report("removed the lock " + lockName)
	}
	return nil
}

// noSuchUpload tells whether err says the upload is gone already
// (completed or aborted after its marker was read).
func noSuchUpload(err error) bool {
	var ae interface{ ErrorCode() string }
	return errors.As(err, &ae) && ae.ErrorCode() == "NoSuchUpload"
}

// remove deletes the object of name.
func (c *client) remove(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := c.s3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(c.addr.Bucket), Key: aws.String(c.addr.key(name))}); err != nil {
		return c.storeError("remove "+name, err)
	}
	return nil
}

// Describe says whose the lock is and what can be known of its dump.
func (l *Lock) Describe() string {
	return fmt.Sprintf("%s (%s)", l.describe(), l.State())
}
