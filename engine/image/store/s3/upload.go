package s3

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

const (
	// partSize is the size of one part of a multipart upload (the last
	// may be shorter): 10,000 parts, S3's limit, make 160 GiB.
	partSize = 16 << 20
	// maxPartsInFlight bounds the parts of one upload going up at once;
	// one more fills meanwhile.
	maxPartsInFlight = 4
	// lockName marks a prefix a dump is writing into.
	lockName = ".lazyfs-dump.lock"
	// uploadMarker starts the name of the object that names a multipart
	// upload under way: uploadMarker + the file's name, holding the
	// upload's id.
	uploadMarker = ".lazyfs-upload."
)

// unsignedPayload leaves the SHA-256 of a body out of a request's
// signature: the body's CRC32C, which the store checks, already covers it,
// and hashing every byte of the pages file a second time would slow the
// dump.
var unsignedPayload = s3.WithAPIOptions(v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware)

// Writer is a snapshot being written to an object store: an
// store.StoreWriter.
type Writer struct {
	c       *client
	ctx     context.Context
	cancel  context.CancelFunc
	mu      sync.Mutex
	written []string  // keys stored so far, for Abort
	keep    []string  // markers of uploads that could not be aborted
	open    []*upload // not yet closed, for Abort
	done    bool
}

// Create starts a snapshot at addr: it refuses a bucket that does not
// exist, credentials the store refuses, and a prefix that holds any
// object already (image.ErrExists), then marks the prefix with a lock
// object created only if absent (image.ErrLocked if another dump got
// there first).
func Create(addr string, o store.Options) (*Writer, error) {
	a, err := ParseAddress(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c, err := newClient(ctx, a, o)
	if err != nil {
		cancel()
		return nil, err
	}
	w := &Writer{c: c, ctx: ctx, cancel: cancel}
	if err := w.lock(a); err != nil {
		cancel()
		return nil, err
	}
	return w, nil
}

// lock checks that the prefix is empty and takes it with a lock object
// naming this dump (see Lock).
func (w *Writer) lock(a Address) error {
	objs, err := w.c.list(w.ctx, maxListed)
	if err != nil {
		return err
	}
	if _, ok := objs[image.ManifestName]; ok {
		return fmt.Errorf("%s: %w", a, image.ErrExists)
	}
	if _, ok := objs[lockName]; ok {
		return w.lockedError(a)
	}
	for _, name := range slices.Sorted(maps.Keys(objs)) {
		if strings.HasPrefix(name, uploadMarker) {
			return fmt.Errorf("%s: %w: it holds %s, the mark of an upload a dump left: clear it with `snapctl cleanup -D %s`", a, image.ErrLocked, name, a)
		}
		return fmt.Errorf("%w: %s is not empty (it holds %s): remove it or dump elsewhere", image.ErrExists, a, name)
	}
	if err := w.putIfAbsent(lockName, ourLock().encode()); err != nil {
		if errors.Is(err, image.ErrExists) {
			return w.lockedError(a) // another dump got there first
		}
		return err
	}
	return nil
}

// maxListed bounds the listing of a prefix a dump checks is empty: one
// page of a listing.
const maxListed = 1000

// lockedError reads the prefix's lock and says whose it is.
func (w *Writer) lockedError(a Address) error {
	l, found, err := w.c.readLock(w.ctx)
	if err != nil {
		return fmt.Errorf("%s: %w (its lock could not be read: %v)", a, image.ErrLocked, err)
	}
	if !found { // removed meanwhile: its dump just ended
		return fmt.Errorf("%s: %w: another dump held it a moment ago: try again", a, image.ErrLocked)
	}
	return lockedError(a, l)
}

func (w *Writer) String() string { return w.c.addr.String() }

// crc32c returns the base64 CRC32C of b, as S3's checksum headers want.
func crc32c(b []byte) string {
	var sum [4]byte
	binary.BigEndian.PutUint32(sum[:], codec.Checksum(b))
	return base64.StdEncoding.EncodeToString(sum[:])
}

// put stores b as the file name with one PUT and its CRC32C.
func (w *Writer) put(name string, b []byte, ifAbsent bool) error {
	ctx, cancel := context.WithTimeout(w.ctx, opTimeout)
	defer cancel()
	in := &s3.PutObjectInput{
		Bucket:         aws.String(w.c.addr.Bucket),
		Key:            aws.String(w.c.addr.key(name)),
		Body:           bytes.NewReader(b),
		ContentLength:  aws.Int64(int64(len(b))),
		ChecksumCRC32C: aws.String(crc32c(b)),
	}
	if ifAbsent {
		in.IfNoneMatch = aws.String("*")
	}
	if _, err := w.c.s3.PutObject(ctx, in, unsignedPayload); err != nil {
		var ae smithy.APIError
		if ifAbsent && errors.As(err, &ae) && (ae.ErrorCode() == "PreconditionFailed" || ae.ErrorCode() == "ConditionalRequestConflict") {
			return image.ErrExists
		}
		return w.c.storeError("write "+name, err)
	}
	w.mu.Lock()
	w.written = append(w.written, name)
	w.mu.Unlock()
	return nil
}

func (w *Writer) putIfAbsent(name string, b []byte) error { return w.put(name, b, true) }

// Create starts the file name: an upload that sends its bytes as it
// gets them.
func (w *Writer) Create(name string) (store.Upload, error) {
	u := &upload{w: w, name: name, key: w.c.addr.key(name), sem: make(chan struct{}, maxPartsInFlight)}
	u.buf = make([]byte, 0, partSize)
	w.mu.Lock()
	w.open = append(w.open, u)
	w.mu.Unlock()
	return u, nil
}

// Commit stores the manifest, only if the prefix has none, then removes
// the lock.
func (w *Writer) Commit(manifest []byte) error {
	// Markers whose delete failed when their upload completed: once more
	// (one left is stale, and snapctl cleanup removes it as such).
	w.mu.Lock()
	var markers []string
	for _, n := range w.written {
		if strings.HasPrefix(n, uploadMarker) {
			markers = append(markers, n)
		}
	}
	w.mu.Unlock()
	w.remove(markers)
	if err := w.putIfAbsent(image.ManifestName, manifest); err != nil {
		if errors.Is(err, image.ErrExists) {
			return fmt.Errorf("%s: %w", w.c.addr, image.ErrExists)
		}
		return err
	}
	w.done = true
	w.remove([]string{lockName})
	w.cancel()
	return nil
}

// Abort aborts the uploads under way and removes every object written,
// the lock last.
func (w *Writer) Abort() {
	if w.done {
		return
	}
	w.done = true
	w.mu.Lock()
	open := slices.Clone(w.open)
	w.mu.Unlock()
	for _, u := range open {
		u.Abort()
	}
	w.mu.Lock()
	keep := w.keep
	written := slices.DeleteFunc(slices.Clone(w.written), func(n string) bool { return n == lockName || slices.Contains(keep, n) })
	w.mu.Unlock()
	// The lock stays if anything else does: it marks what is left as a
	// dead dump's, for snapctl cleanup.
	if w.remove(written) && len(keep) == 0 {
		w.remove([]string{lockName})
	}
	w.cancel()
}

// remove deletes the objects of names and reports whether every delete
// succeeded (a dump that failed leaves what it could not remove, and the
// next dump there refuses the prefix, naming it).
func (w *Writer) remove(names []string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	ok := true
	for _, n := range names {
		if _, err := w.c.s3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(w.c.addr.Bucket), Key: aws.String(w.c.addr.key(n))}); err != nil {
			ok = false
		}
	}
	return ok
}

// upload is one file being written: one PUT if it fits in a part, else
// a multipart upload whose parts go up in parallel as they fill.
type upload struct {
	w    *Writer
	name string
	key  string
	buf  []byte
	id   string // the multipart upload's, once started
	sem  chan struct{}
	wg   sync.WaitGroup

	mu     sync.Mutex
	parts  []types.CompletedPart
	err    error
	closed bool
}

func (u *upload) firstErr() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.err
}

func (u *upload) fail(err error) {
	u.mu.Lock()
	if u.err == nil {
		u.err = err
	}
	u.mu.Unlock()
}

// Write buffers b and sends every part it fills; it returns the first
// error of a part as soon as it is known.
func (u *upload) Write(b []byte) (int, error) {
	done := 0
	for done < len(b) {
		n := copy(u.buf[len(u.buf):cap(u.buf)], b[done:])
		u.buf = u.buf[:len(u.buf)+n]
		done += n
		if len(u.buf) == cap(u.buf) {
			if err := u.sendPart(); err != nil {
				return done, err
			}
		}
	}
	return done, u.firstErr()
}

// sendPart hands the full buffer to a goroutine that uploads it as the
// next part, waiting for a free slot.
func (u *upload) sendPart() error {
	if err := u.firstErr(); err != nil {
		return err
	}
	if u.id == "" {
		ctx, cancel := context.WithTimeout(u.w.ctx, opTimeout)
		out, err := u.w.c.s3.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
			Bucket: aws.String(u.w.c.addr.Bucket), Key: aws.String(u.key), ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c,
		})
		cancel()
		if err != nil {
			err = u.w.c.storeError("start upload of "+u.name, err)
			u.fail(err)
			return err
		}
		u.id = aws.ToString(out.UploadId)
		// A marker object names the upload until it is completed or
		// aborted: a store need not list uploads by prefix (MinIO
		// lists them by exact key only), and a dump that dies leaves
		// the upload behind, for snapctl cleanup to find.
		if err := u.w.put(u.marker(), []byte(u.id+"\n"), false); err != nil {
			u.abortUpload()
			u.fail(err)
			return err
		}
	}
	select {
	case u.sem <- struct{}{}:
	case <-u.w.ctx.Done():
		return u.w.ctx.Err()
	}
	data := u.buf
	num := int32(len(u.parts)) + 1
	u.mu.Lock()
	u.parts = append(u.parts, types.CompletedPart{PartNumber: aws.Int32(num)})
	u.mu.Unlock()
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		defer func() { <-u.sem }()
		sum := crc32c(data)
		ctx, cancel := context.WithTimeout(u.w.ctx, opTimeout)
		out, err := u.w.c.s3.UploadPart(ctx, &s3.UploadPartInput{
			Bucket: aws.String(u.w.c.addr.Bucket), Key: aws.String(u.key), UploadId: aws.String(u.id),
			PartNumber: aws.Int32(num), Body: bytes.NewReader(data), ContentLength: aws.Int64(int64(len(data))),
			ChecksumCRC32C: aws.String(sum),
		}, unsignedPayload)
		cancel()
		if err != nil {
			u.fail(u.w.c.storeError(fmt.Sprintf("upload part %d of %s", num, u.name), err))
			return
		}
		u.mu.Lock()
		u.parts[num-1].ETag = out.ETag
		u.parts[num-1].ChecksumCRC32C = aws.String(sum)
		u.mu.Unlock()
	}()
	u.buf = make([]byte, 0, partSize)
	return nil
}

// Close sends what is buffered and completes the file.
func (u *upload) Close() error {
	if u.closed {
		return u.firstErr()
	}
	u.closed = true
	defer u.forget()
	if u.id == "" { // it fits in one part: one PUT
		if err := u.firstErr(); err != nil {
			return err
		}
		return u.w.put(u.name, u.buf, false)
	}
	if len(u.buf) > 0 {
		if err := u.sendPart(); err != nil {
			u.wg.Wait()
			u.abortUpload()
			return err
		}
	}
	u.wg.Wait()
	if err := u.firstErr(); err != nil {
		u.abortUpload()
		return err
	}
	sort.Slice(u.parts, func(i, j int) bool { return *u.parts[i].PartNumber < *u.parts[j].PartNumber })
	ctx, cancel := context.WithTimeout(u.w.ctx, opTimeout)
	defer cancel()
	_, err := u.w.c.s3.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: aws.String(u.w.c.addr.Bucket), Key: aws.String(u.key), UploadId: aws.String(u.id),
		MultipartUpload: &types.CompletedMultipartUpload{Parts: u.parts},
	})
	if err != nil {
		u.abortUpload()
		return u.w.c.storeError("complete upload of "+u.name, err)
	}
	u.w.mu.Lock()
	u.w.written = append(u.w.written, u.name)
	u.w.mu.Unlock()
	// The marker goes with the upload; one left by a failed delete names
	// an upload that no longer exists, which cleanup removes.
	if u.w.c.remove(ctx, u.marker()) == nil {
		u.w.mu.Lock()
		u.w.written = slices.DeleteFunc(u.w.written, func(n string) bool { return n == u.marker() })
		u.w.mu.Unlock()
	}
	return nil
}

// marker is the name of the object that names u's multipart upload while
// it is under way.
func (u *upload) marker() string { return uploadMarker + u.name }

// Abort drops the upload: the parts sent so far are discarded.
func (u *upload) Abort() {
	if u.closed {
		return
	}
	u.closed = true
	u.fail(errors.New("upload aborted"))
	u.wg.Wait()
	u.abortUpload()
	u.forget()
}

// abortUpload aborts the multipart upload, if one was started. One that
// cannot be aborted keeps its marker (and so the dump's lock): snapctl
// cleanup finds it there.
func (u *upload) abortUpload() {
	if u.id == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	_, err := u.w.c.s3.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String(u.w.c.addr.Bucket), Key: aws.String(u.key), UploadId: aws.String(u.id)})
	if err != nil && !noSuchUpload(err) {
		u.w.mu.Lock()
		u.w.keep = append(u.w.keep, u.marker())
		u.w.mu.Unlock()
	}
}

// forget removes u from the writer's open uploads.
func (u *upload) forget() {
	u.w.mu.Lock()
	u.w.open = slices.DeleteFunc(u.w.open, func(x *upload) bool { return x == u })
	u.w.mu.Unlock()
}
