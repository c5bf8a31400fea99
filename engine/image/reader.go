package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/lazyfs/lazyfs/cache"
	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image/seal"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

// BlockError reports a block that cannot be read or fails its checksum. It
// names the file, the block and the address.
type BlockError struct {
	File  string
	Block uint64
	Addr  uint64
	Err   error
}

func (e *BlockError) Error() string {
	return fmt.Sprintf("%s: block %d at %#x: %v", e.File, e.Block, e.Addr, e.Err)
}

func (e *BlockError) Unwrap() error { return e.Err }

// Snapshot is an opened, complete snapshot: a directory, or an address
// in an object store (see store.Store). A directory is opened once, by Open:
// every file is then opened through it, never following a link, so that
// nothing done to the path afterwards changes what is read.
type Snapshot struct {
	Dir      string
	Manifest *Manifest
	manifest []byte // snapshot.json as read
	store    store.Store
	trust    bool       // OpenOptions.Trust
	keys     *seal.Keys // of a sealed snapshot, opened
	signed   bool       // its signature verified
	parent   *Snapshot  // of an incremental snapshot (parent.go)
	opts     OpenOptions

	// ppids are the parent pids of the states State parsed, so that a
	// page reader with Forked blocks finds its parent process's without
	// parsing the state a second time.
	ppidMu sync.Mutex
	ppids  map[int]int
}

// OpenOptions tune OpenWith.
type OpenOptions struct {
	// Trust accepts a snapshot that a user other than the caller and root
	// can change (snapctl --trust-snapshot): its directory or a file
	// writable by group or others, or owned by another user. Without it
	// such a snapshot is refused (ErrUntrusted): it is memory and code
	// that a restore runs, as root if the process was root's.
	Trust bool
	// Remote configures the store of a snapshot given by address
	// (s3://BUCKET/PREFIX).
	Remote store.Options
	// Keys are the identities that open sealed snapshots. With Keys, a
	// snapshot that is not sealed is refused (ErrNoIdentity): whoever
	// gives a key expects what it authenticates. Without, a sealed
	// snapshot is refused (ErrNoIdentity). They serve whatever holds the
	// snapshot: a directory or an object store.
	Keys *seal.Keyring

	// asParent, set when the snapshot is opened as the parent of another,
	// is what the child recorded of it: checked before its own parent is
	// opened (parent.go).
	asParent *parentCheck
}

// Open opens the snapshot in dir: OpenWith with no options.
func Open(dir string) (*Snapshot, error) { return OpenWith(dir, OpenOptions{}) }

// OpenWith opens the snapshot in dir, a directory or the address of a
// snapshot in an object store whose scheme is registered (store.RegisterScheme).
// It refuses a snapshot without a manifest (ErrIncomplete), a directory
// that another user can change (ErrUntrusted, unless o.Trust), and checks
// that every file the manifest lists is there, a regular file (not a
// link) of its size.
func OpenWith(dir string, o OpenOptions) (*Snapshot, error) {
	st, err := OpenStore(dir, o)
	if err != nil {
		return nil, err
	}
	s, err := openSnapshot(st, o.Keys)
	if err != nil {
		st.Close()
		return nil, err
	}
	s.trust, s.opts = o.Trust, o
	if err := s.checkAsParent(o.asParent); err != nil {
		st.Close()
		return nil, err
	}
	if s.Manifest.Parent != nil {
		if err := s.openParent(o); err != nil {
			st.Close()
			return nil, err
		}
	}
	return s, nil
}

func openSnapshot(st store.Store, keyring *seal.Keyring) (*Snapshot, error) {
	raw, err := readManifestBytes(st)
	if err != nil {
		return nil, err
	}
	var keys *seal.Keys
	var signed bool
	if keyring != nil {
		// The manifest is authenticated before anything in it is used.
		if keys, signed, err = authenticate(st, raw, keyring); err != nil {
			return nil, err
		}
	}
	m, err := parseManifest(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", joinName(st.String(), ManifestName), err)
	}
	if err := checkKeys(st.String(), m, keys, signed); err != nil {
		return nil, err
	}
	mismatch := ErrManifestMismatch
	if keys != nil || signed {
		mismatch = ErrAuth // the manifest is authenticated: the file changed
	}
	for _, name := range slices.Sorted(maps.Keys(m.Files)) {
		size, err := st.Stat(name)
		if err != nil {
			return nil, err
		}
		if sum := m.Files[name]; size != sum.Size {
			return nil, fmt.Errorf("%s: %w: %d bytes, manifest says %d", name, mismatch, size, sum.Size)
		}
	}
	return &Snapshot{Dir: st.String(), Manifest: m, manifest: raw, store: st, keys: keys, signed: signed}, nil
}

// joinName names the file name of the snapshot at dir (a directory or an
// address).
func joinName(dir, name string) string {
	if store.IsRemote(dir) {
		return strings.TrimSuffix(dir, "/") + "/" + name
	}
	return filepath.Join(dir, name)
}

// Close closes the snapshot's store. Readers opened from it stay usable.
func (s *Snapshot) Close() error {
	if s.parent != nil {
		s.parent.Close()
	}
	return s.store.Close()
}

// OpenFile opens one file of the snapshot for reading, through its
// directory (never following a link) or its store.
func (s *Snapshot) OpenFile(name string) (store.File, error) { return s.store.Open(name) }

// ManifestJSON returns snapshot.json as Open read it (and checked it),
// byte for byte. The slice must not be modified.
func (s *Snapshot) ManifestJSON() []byte { return s.manifest }

// PIDs returns the processes of the snapshot.
func (s *Snapshot) PIDs() []int {
	pids := make([]int, len(s.Manifest.Processes))
	for i, p := range s.Manifest.Processes {
		pids[i] = p.PID
	}
	return pids
}

// readSmall reads a whole file that the manifest lists, checking its size
// bound and its CRC32C.
func (s *Snapshot) readSmall(name string, limit int64) ([]byte, error) {
	sum := s.Manifest.Files[name]
	if sum.Size > limit {
		return nil, fmt.Errorf("%s: %w: %d bytes, limit %d", name, ErrCorrupt, sum.Size, limit)
	}
	b, err := readAll(s.store, name, sum.Size, false)
	if err != nil {
		return nil, err
	}
	if crcHex(codec.Checksum(b)) != sum.CRC32C {
		// A copy kept by the store's cache may be what is wrong: read
		// again past it, once (see Forgetter).
		if again, err := readAll(s.store, name, sum.Size, true); err == nil {
			b = again
		}
	}
	if got := crcHex(codec.Checksum(b)); got != sum.CRC32C {
		mismatch := ErrManifestMismatch
		if s.keys != nil || s.signed {
			mismatch = ErrAuth
		}
		return nil, fmt.Errorf("%s: %w: crc32c %s, manifest says %s", name, mismatch, got, sum.CRC32C)
	}
	if s.signed {
		if d := sha256.Sum256(b); hex.EncodeToString(d[:]) != sum.SHA256 {
			return nil, fmt.Errorf("%s: %w: its SHA-256 is not the one the signed manifest holds", name, ErrAuth)
		}
	}
	return b, nil
}

func (s *Snapshot) entry(pid int) (ProcessEntry, error) {
	e, ok := s.Manifest.Process(pid)
	if !ok {
		return e, fmt.Errorf("snapshot %s holds no process %d", s.Dir, pid)
	}
	return e, nil
}

// StateJSON returns the bytes of process-PID.json, checked.
func (s *Snapshot) StateJSON(pid int) ([]byte, error) {
	e, err := s.entry(pid)
	if err != nil {
		return nil, err
	}
	b, err := s.readSmall(e.State, maxStateSize+sealHeaderSize+seal.TagSize)
	if err != nil || s.keys == nil {
		return b, err
	}
	b, _, err = openFile(s.keys, e.State, b, roleState, pid)
	return b, err
}

// State returns the process state of pid.
func (s *Snapshot) State(pid int) (*Process, error) {
	p, _, err := s.StateAndJSON(pid)
	return p, err
}

// StateAndJSON returns the process state of pid and the JSON it was
// decoded from (StateJSON), read once.
func (s *Snapshot) StateAndJSON(pid int) (*Process, []byte, error) {
	b, err := s.StateJSON(pid)
	if err != nil {
		return nil, nil, err
	}
	var p Process
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, nil, fmt.Errorf("%s: %w: %v", stateName(pid), ErrCorrupt, err)
	}
	if p.PID != pid {
		return nil, nil, fmt.Errorf("%s: %w: holds pid %d", stateName(pid), ErrCorrupt, p.PID)
	}
	if err := p.Validate(); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", stateName(pid), err)
	}
	s.ppidMu.Lock()
	if s.ppids == nil {
		s.ppids = map[int]int{}
	}
	s.ppids[pid] = p.PPID
	s.ppidMu.Unlock()
	return &p, b, nil
}

// ppid returns the parent pid that pid's state names: the one State
// parsed, or else decoded from the state alone, not the whole process
// (a mount of memory alone reads no state otherwise; fs's memOnly).
func (s *Snapshot) ppid(pid int) (int, error) {
	s.ppidMu.Lock()
	ppid, ok := s.ppids[pid]
	s.ppidMu.Unlock()
	if ok {
		return ppid, nil
	}
	b, err := s.StateJSON(pid)
	if err != nil {
		return 0, err
	}
	var ids struct {
		PID  int `json:"pid"`
		PPID int `json:"ppid"`
	}
	if err := json.Unmarshal(b, &ids); err != nil {
		return 0, fmt.Errorf("%s: %w: %v", stateName(pid), ErrCorrupt, err)
	}
	if ids.PID != pid {
		return 0, fmt.Errorf("%s: %w: holds pid %d", stateName(pid), ErrCorrupt, ids.PID)
	}
	return ids.PPID, nil
}

// ReaderOptions configure a page reader.
type ReaderOptions struct {
	// Cache holds decoded blocks; nil means a private cache of
	// DefaultCacheSize.
	Cache *cache.Cache
	// Threads is --decompress-threads: 1 serial, 0 automatic, N a maximum.
	Threads int
	// Readahead enables decoding ahead of sequential readers (bounded
	// batches, two in flight).
	Readahead bool
	Logger    *slog.Logger
}

// DefaultCacheSize is the size of a reader's private cache.
const DefaultCacheSize = 64 << 20

// readaheadBatch is the decoded size of one readahead batch; at most two
// are in flight.
const readaheadBatch = 32 << 20

// Reader reads the memory of one process of a snapshot.
type Reader struct {
	name    string // pages file name, for errors
	pid     int    // the process whose memory it reads
	f       store.File
	src     io.ReaderAt // payloads: f, or f decrypted (sealedPages)
	auth    bool        // src authenticates every block (Authenticated)
	window  uint64      // Raw blocks larger than it are sealed in windows (Seal.Window)
	lay     *layout
	cache   *cache.Cache
	file    uint64 // key space in the cache
	threads int
	log     *slog.Logger
	stats   Stats
	// pcrc are the page checksums of Raw blocks (FeaturePageCRC), or nil.
	pcrc *pageCRCs
	// parent reads the parent's pages of an incremental snapshot, whose
	// virtual pages file starts at base in src (parent.go).
	parent *Reader
	base   uint64

	readahead bool
	raMu      sync.Mutex
	raNext    uint64 // address the next readahead batch starts at
	raLast    atomic.Uint64
	raWG      sync.WaitGroup
	raFlight  int
	ctx       context.Context
	cancel    context.CancelFunc
}

// Options returns the options the snapshot was opened with: a helper
// process that opens it again (a private mount) opens it so.
func (s *Snapshot) Options() OpenOptions {
	o := s.opts
	o.asParent = nil
	return o
}

// PID returns the process whose memory r reads.
func (r *Reader) PID() int { return r.pid }

// OpenPages opens the page image of pid.
func (s *Snapshot) OpenPages(pid int, opts ReaderOptions) (*Reader, error) {
	return s.openPages(pid, opts, 0)
}

// openPages is OpenPages of a process whose Forked blocks are resolved
// depth parents down from the process first asked for (forked.go). It
// composes the layers of a process's pages, each in a function of its
// own: the index and the pages file (sealed: the index opened first),
// then the blocks' authentication (sealed or signed), the page
// checksums, the parent snapshot's blocks and the parent process's.
func (s *Snapshot) openPages(pid int, opts ReaderOptions, depth int) (*Reader, error) {
	e, err := s.entry(pid)
	if err != nil {
		return nil, err
	}
	b, tags, err := s.readIndex(e, pid)
	if err != nil {
		return nil, err
	}
	f, ix, err := s.openPagesFile(e, b)
	if err != nil {
		return nil, err
	}
	if s.keys == nil && s.signed {
		if tags, err = s.readSmall(e.Digests, maxBlocks*seal.DigestSize); err != nil {
			f.Close()
			return nil, err
		}
	}
	r, err := newReader(e.Pages, f, ix, opts)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", e.Index, err)
	}
	r.pid = pid
	for _, layer := range []func() error{
		func() error { return s.authenticatePages(r, e, tags) },
		func() error { return r.openPageCRCs(s, e.PageCRCs) },
		func() error { return s.chain(r, pid, opts) },
		func() error { return s.forkedParent(r, pid, opts, depth) },
	} {
		if err := layer(); err != nil {
			r.Close() // and f
			return nil, err
		}
	}
	return r, nil
}

// readIndex reads the page index of process e, and opens it if the
// snapshot is sealed: it returns the index and the blocks' tags (nil
// unless sealed).
func (s *Snapshot) readIndex(e ProcessEntry, pid int) (index, tags []byte, err error) {
	b, err := s.readSmall(e.Index, int64(indexHeaderSize)+maxRuns*runRecordSize+maxBlocks*(blockRecordSize+seal.TagSize)+sealHeaderSize+seal.TagSize)
	if err != nil || s.keys == nil {
		return b, nil, err
	}
	return openFile(s.keys, e.Index, b, roleIndex, pid)
}

// openPagesFile opens the pages file of process e and parses its index
// b against the file's size and the manifest's block size.
func (s *Snapshot) openPagesFile(e ProcessEntry, b []byte) (store.File, *Index, error) {
	size, err := s.store.Stat(e.Pages)
	if err != nil {
		return nil, nil, fmt.Errorf("open pages: %w", err)
	}
	f, err := s.OpenFile(e.Pages)
	if err != nil {
		return nil, nil, fmt.Errorf("open pages: %w", err)
	}
	ix, err := UnmarshalIndex(b, size)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w", e.Index, err)
	}
	if ix.BlockSize != uint64(s.Manifest.BlockSize) {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w: block size %d, manifest says %d", e.Index, ErrCorrupt, ix.BlockSize, s.Manifest.BlockSize)
	}
	return f, ix, nil
}

// authenticatePages makes r read the payloads of a sealed or signed
// snapshot through their authentication (sealedPages), tags being the
// blocks' GCM tags or SHA-256 digests.
func (s *Snapshot) authenticatePages(r *Reader, e ProcessEntry, tags []byte) error {
	if s.keys != nil {
		r.window = s.Manifest.Seal.Window
	}
	if s.keys == nil && !s.signed {
		return nil
	}
	src, err := newSealedPages(e.Pages, r.f, r.lay, s.keys, r.window, r.pid, tags)
	if err != nil {
		return fmt.Errorf("%s: %w", e.Index, err)
	}
	r.src, r.auth = src, true
	return nil
}

func newReader(name string, f store.File, ix *Index, opts ReaderOptions) (*Reader, error) {
	lay, err := newLayout(ix)
	if err != nil {
		return nil, err
	}
	if opts.Cache == nil {
		opts.Cache = cache.New(DefaultCacheSize)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Reader{name: name, f: f, src: f, lay: lay, cache: opts.Cache, file: opts.Cache.NewFile(), threads: opts.Threads,
		log: opts.Logger, readahead: opts.Readahead, ctx: ctx, cancel: cancel}
	var k [codec.NumKinds]KindStats
	for i, rec := range ix.Blocks {
		b := lay.block(lay.runOfBlock(uint64(i)), uint64(i))
		k[rec.Kind].Blocks++
		k[rec.Kind].Bytes += uint64(b.Len)
		k[rec.Kind].Stored += uint64(rec.StoredLen)
	}
	r.stats = newStats(k)
	r.stats.FileSize = ix.PagesSize
	r.stats.Runs = len(ix.Runs)
	return r, nil
}

// Close stops readahead and closes the pages file.
func (r *Reader) Close() error {
	r.cancel()
	r.raWG.Wait()
	if r.parent != nil {
		r.parent.Close()
	}
	return r.f.Close()
}

// Payloads returns the pages file as an io.ReaderAt of block payloads
// at their offsets (Block.Off): decrypted and authenticated block by
// block for a sealed snapshot, the file itself otherwise. It is what the
// restore's fill reads Raw blocks and decodes LZ4 blocks from. Valid
// until r is closed.
func (r *Reader) Payloads() io.ReaderAt { return r.src }

// Authenticated reports whether Payloads authenticates every block it
// returns, stored bytes and identity (a sealed snapshot's AES-GCM, a
// signed one's SHA-256 under the signed index), before returning it. A
// decoded block's CRC32C then catches nothing more, and the readers of r
// do not check it (but Verify); nor need the restore's fill.
func (r *Reader) Authenticated() bool { return r.auth }

// Name returns the pages file name.
func (r *Reader) Name() string { return r.name }

// BlockSize returns the snapshot's block size.
func (r *Reader) BlockSize() uint64 { return r.lay.ix.BlockSize }

// Runs returns the dumped ranges, sorted by address. The slice must not be
// modified.
func (r *Reader) Runs() []Run { return r.lay.ix.Runs }

// End returns the address after the last dumped page.
func (r *Reader) End() uint64 {
	runs := r.lay.ix.Runs
	if len(runs) == 0 {
		return 0
	}
	return runs[len(runs)-1].End()
}

// Stats returns the figures of the image.
func (r *Reader) Stats() Stats { return r.stats }

// CacheStats returns the figures of the cache the reader uses.
func (r *Reader) CacheStats() cache.Stats { return r.cache.Stats() }

// BlockAt returns the block holding addr.
func (r *Reader) BlockAt(addr uint64) (Block, bool) { return r.lay.blockAt(addr) }

// Blocks returns every block, in address order.
func (r *Reader) Blocks() iter.Seq[Block] {
	return func(yield func(Block) bool) {
		for ri, run := range r.lay.ix.Runs {
			n := blocksInRange(run.Addr, run.End(), r.lay.ix.BlockSize)
			for j := uint64(0); j < n; j++ {
				if !yield(r.lay.block(ri, run.FirstBlock+j)) {
					return
				}
			}
		}
	}
}

// DumpedIn returns how many dumped bytes lie in [lo, hi) (the st_blocks
// of a window of memory, the DUMPED column of snapctl inspect).
func (r *Reader) DumpedIn(lo, hi uint64) uint64 {
	if hi <= lo {
		return 0
	}
	var n uint64
	ri, _ := r.lay.findRun(lo)
	for runs := r.lay.ix.Runs; ri < len(runs) && runs[ri].Addr < hi; ri++ {
		n += min(hi, runs[ri].End()) - max(lo, runs[ri].Addr)
	}
	return n
}

// NextData returns the start of the first dumped byte at or after addr
// (lseek SEEK_DATA), or false if there is none.
func (r *Reader) NextData(addr uint64) (uint64, bool) {
	ri, in := r.lay.findRun(addr)
	if in {
		return addr, true
	}
	if ri == len(r.lay.ix.Runs) {
		return 0, false
	}
	return r.lay.ix.Runs[ri].Addr, true
}

// NextHole returns the first address at or after addr that was not dumped
// (lseek SEEK_HOLE).
func (r *Reader) NextHole(addr uint64) uint64 {
	ri, in := r.lay.findRun(addr)
	if !in {
		return addr
	}
	runs := r.lay.ix.Runs
	end := runs[ri].End()
	for ri++; ri < len(runs) && runs[ri].Addr == end; ri++ {
		end = runs[ri].End() // runs that touch at a VMA boundary are one data range
	}
	return end
}

// blockError wraps err with the block's identity.
func (r *Reader) blockError(b Block, err error) error {
	if be, ok := errors.AsType[*BlockError](err); ok {
		r.log.Error("bad block", "file", be.File, "block", be.Block, "addr", fmt.Sprintf("%#x", be.Addr), "err", be.Err)
		return be // a sealed block that fails its authentication names itself
	}
	file, index := r.origin(b)
	be := &BlockError{File: file, Block: index, Addr: b.Addr, Err: err}
	r.log.Error("bad block", "file", file, "block", index, "addr", fmt.Sprintf("%#x", b.Addr), "err", err)
	return be
}

// load reads and decodes block b into dst (len(dst) == b.Len) and checks
// its CRC32C: a Raw block is read in place, then checked; an LZ4 block is
// read into a scratch buffer and decoded into dst, then checked (an
// authenticated block is not: see Authenticated). The cached ReadAt and
// the uncached reader (Uncached) both load through it.
func (r *Reader) load(b Block, dst []byte) error {
	return r.refetching(b, func() error { return r.loadOnce(b, dst) })
}

// refetching runs read, a read of block b from the source, and if it
// fails as bytes a cache kept wrong would (Refetchable), drops the
// source's copy of the block (Forgetter) and runs it once more before
// the block is called corrupt. The second read is made even if the
// source held nothing: another reader may have dropped the same chunk a
// moment before, its fetch not yet done.
func (r *Reader) refetching(b Block, read func() error) error {
	err := read()
	if err == nil || !Refetchable(err) {
		return err
	}
	f, ok := r.src.(Forgetter)
	if !ok {
		return err
	}
	if f.Forget(int64(b.Off), int64(b.StoredLen)) {
		r.log.Warn("block fetched again: its cached copy failed its check", "addr", fmt.Sprintf("%#x", b.Addr), "err", err)
	}
	return read()
}

// Refetchable tells whether a block's error may come from bytes a cache
// kept wrong (a checksum, a decoder's or an authentication failure), so
// that reading the block again past the cache (Forgetter) may cure it.
func Refetchable(err error) bool {
	return errors.Is(err, codec.ErrChecksum) || errors.Is(err, codec.ErrUndecodable) || errors.Is(err, ErrAuth)
}

// Forgetter is a pages file (a store.File) whose bytes may come from a
// cache of its own, such as an object store's chunks kept on disk.
type Forgetter interface {
	// Forget drops what the cache holds of [off, off+n), so that the next
	// read fetches it again; it reports whether it held any.
	Forget(off, n int64) bool
}

// loadOnce is one try of load.
func (r *Reader) loadOnce(b Block, dst []byte) error {
	switch b.Kind {
	case codec.Raw:
		if err := r.pread(b, dst); err != nil {
			return err
		}
		return r.checkRaw(b, dst)
	}
	var stored []byte // nil for a Zero block
	if b.Kind != codec.Zero {
		buf := scratch(int(b.StoredLen))
		defer scratchPool.Put(buf)
		if err := r.pread(b, *buf); err != nil {
			return err
		}
		stored = *buf
	}
	var err error
	if r.auth {
		err = codec.Decode(dst, b.Kind, stored)
	} else {
		err = codec.DecodeChecked(dst, b.Kind, stored, b.CRC)
	}
	if err != nil {
		return r.blockError(b, err)
	}
	return nil
}

// pread reads len(dst) bytes of the pages file from the payload of block
// b on (the payloads of the blocks after it, if dst is longer).
func (r *Reader) pread(b Block, dst []byte) error { return r.preadAt(b, dst, b.Off) }

// preadAt reads len(dst) bytes of the payloads at off, in block b or from
// it on.
func (r *Reader) preadAt(b Block, dst []byte, off uint64) error {
	if _, err := r.src.ReadAt(dst, int64(off)); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return r.blockError(b, err)
	}
	return nil
}

// openPageCRCs reads the page-checksum file name of the snapshot, if
// it has one ("" for none).
func (r *Reader) openPageCRCs(s *Snapshot, name string) error {
	if name == "" {
		return nil
	}
	b, err := s.readSmall(name, pageCRCHeaderSize+4*maxPageCRCs)
	if err != nil {
		return err
	}
	crcs, err := unmarshalPageCRCs(b)
	if err == nil {
		r.pcrc, err = newPageCRCs(r.lay, crcs)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// PageChecked reports whether block b's pages can be read and checked one
// by one (a Raw block of a snapshot with page checksums), or its windows
// read and authenticated one by one (a Raw block of a sealed snapshot
// sealed in windows).
func (r *Reader) PageChecked(b Block) bool { return r.pageCRCs(b) || r.windowed(b) }

// pageCRCs reports whether block b has page checksums.
func (r *Reader) pageCRCs(b Block) bool {
	return r.pcrc != nil && hasPageCRCsFor(b) && (r.parent == nil || r.pcrc.covers(b.Index))
}

// Unit returns a range around addr (inside a dumped block) that can be
// read and checked on its own: in a block whose pages are checked one by
// one, the size-aligned window around addr (size a page multiple) clipped
// to the block; otherwise the block. ok is false outside every block.
func (r *Reader) Unit(addr, size uint64) (lo, hi uint64, ok bool) {
	b, ok := r.lay.blockAt(addr)
	if !ok {
		return 0, 0, false
	}
	if r.windowed(b) {
		lo, hi = r.sealedWindow(b, addr)
		return lo, hi, true
	}
	if r.pageCRCs(b) {
		size = max(PageSize, size&^(PageSize-1))
		lo = max(b.Addr, addr/size*size)
		return lo, min(b.End(), lo+size), true
	}
	return b.Addr, b.End(), true
}

// loadPages reads the pages [at, at+len(dst)) of block b, which must be
// PageChecked, page aligned and inside it, into dst and checks each.
func (r *Reader) loadPages(b Block, at uint64, dst []byte) error {
	return r.refetching(b, func() error {
		if _, err := r.src.ReadAt(dst, int64(b.Off+(at-b.Addr))); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return r.blockError(b, err)
		}
		if err := r.pcrc.check(b, at, dst); err != nil {
			return r.blockError(b, err)
		}
		return nil
	})
}

// readPart reads [lo, hi) of block b, a part of it, into dst: the pages
// that hold it alone if b is PageChecked (through a scratch buffer unless
// the part is whole pages), else the whole block through a scratch buffer.
func (r *Reader) readPart(b Block, lo, hi uint64, dst []byte) error {
	if r.windowed(b) {
		// The payloads authenticate the windows that hold [lo, hi) and
		// decrypt into dst what of them it holds.
		return r.refetching(b, func() error { return r.preadAt(b, dst, b.Off+(lo-b.Addr)) })
	}
	plo, phi := lo&^(PageSize-1), alignUp(hi, PageSize)
	if !r.pageCRCs(b) {
		plo, phi = b.Addr, b.End()
	}
	if plo == lo && phi == hi && r.pageCRCs(b) {
		return r.loadPages(b, lo, dst)
	}
	buf := scratch(int(phi - plo))
	defer scratchPool.Put(buf)
	var err error
	if r.pageCRCs(b) {
		err = r.loadPages(b, plo, *buf)
	} else {
		err = r.load(b, *buf)
	}
	copy(dst, (*buf)[lo-plo:hi-plo])
	return err
}

// checkRaw checks the CRC32C of Raw block b, read into data, unless
// the block was authenticated as it was read.
func (r *Reader) checkRaw(b Block, data []byte) error {
	if r.auth {
		return nil
	}
	if got := codec.Checksum(data); got != b.CRC {
		return r.blockError(b, fmt.Errorf("%w: crc32c %08x, want %08x", codec.ErrChecksum, got, b.CRC))
	}
	return nil
}

// scratchPool holds buffers for LZ4 payloads and partly read blocks.
var scratchPool = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// scratch returns a buffer of n bytes from scratchPool; put it back when
// done.
func scratch(n int) *[]byte {
	b := scratchPool.Get().(*[]byte)
	if cap(*b) < n {
		*b = make([]byte, n)
	}
	*b = (*b)[:n]
	return b
}

// get returns block b from the cache, decoding it once if needed.
func (r *Reader) get(ctx context.Context, b Block) (*cache.Ref, error) {
	return r.cache.Get(ctx, cache.Key{File: r.file, Block: b.Index}, int(b.Len), func(dst []byte) error {
		return r.load(b, dst)
	})
}

// ReadAt reads the memory at address off into p. Addresses that were not
// dumped read as zeros. A partial read of a block decodes the whole block
// into the cache once.
func (r *Reader) ReadAt(p []byte, off int64) (int, error) {
	return r.ReadAtWith(context.Background(), p, off, ReadOptions{})
}

// ReadOptions tune one read of a Reader (ReadAtWith).
type ReadOptions struct {
	// Kept is for a reader that keeps what it reads: a FUSE reply to a
	// file whose pages the kernel keeps in its page cache. A block whose
	// every page has been read this way leaves the block cache
	// (cache.Ref.Served): the reader's copy is the one kept, so the
	// decoded bytes are held once. Blocks read in part stay until the
	// rest is read or they are evicted.
	Kept bool
	// NoReadahead decodes the blocks that the read touches and no others,
	// whatever the reads before it (a debugger's reads of a core file,
	// scattered and small, must not decode memory nobody asked for).
	NoReadahead bool
}

// ReadAtWith is ReadAt with a context for waits on the cache, and the
// options o.
func (r *Reader) ReadAtWith(ctx context.Context, p []byte, off int64, o ReadOptions) (int, error) {
	return r.readAt(ctx, p, off, r.readahead && !o.NoReadahead, o.Kept)
}

// readAt reads [off, off+len(p)): ahead reads ahead of a sequential
// reader, kept says the reader keeps the bytes (ReadOptions.Kept).
func (r *Reader) readAt(ctx context.Context, p []byte, off int64, ahead, kept bool) (int, error) {
	addr, end, err := checkRead(off, len(p))
	if err != nil {
		return 0, err
	}
	// The end of this read is noted before it starts: readahead in
	// flight skips the blocks behind it, which this read loads itself
	// (and a reader that keeps them may have served whole and dropped
	// from the cache before the read ends).
	var last uint64
	if ahead {
		last = r.noteRead(end)
	}
	var todo []Block
	err = r.lay.walk(addr, end, func(s span) (uint64, error) {
		if !s.in || s.b.Kind == codec.Zero {
			clear(p[s.lo-addr : s.hi-addr])
		} else {
			todo = append(todo, s.b)
		}
		return s.hi, nil
	})
	if err != nil {
		return 0, err
	}
	copyOut := func(b Block) error {
		if lo, hi := max(addr, b.Addr), min(end, b.End()); (lo > b.Addr || hi < b.End()) && r.PageChecked(b) {
			// Part of a block whose pages are checked one by one: read
			// those pages, unless the block is in the cache already.
			if ref, ok := r.cache.Peek(cache.Key{File: r.file, Block: b.Index}); ok {
				copy(p[lo-addr:hi-addr], ref.Bytes()[lo-b.Addr:hi-b.Addr])
				if kept {
					ref.Served(int(lo-b.Addr), int(hi-b.Addr))
				}
				ref.Release()
				return nil
			}
			return r.readPart(b, lo, hi, p[lo-addr:hi-addr])
		}
		ref, err := r.get(ctx, b)
		if err != nil {
			return err
		}
		lo, hi := max(addr, b.Addr), min(end, b.End())
		copy(p[lo-addr:hi-addr], ref.Bytes()[lo-b.Addr:hi-b.Addr])
		if kept {
			ref.Served(int(lo-b.Addr), int(hi-b.Addr))
		}
		ref.Release()
		return nil
	}
	if t := r.parallelism(todo); t > 1 {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(t)
		for _, b := range todo {
			g.Go(func() error {
				if gctx.Err() != nil {
					return gctx.Err()
				}
				return copyOut(b)
			})
		}
		if err := g.Wait(); err != nil {
			return 0, err
		}
	} else {
		for _, b := range todo {
			if err := copyOut(b); err != nil {
				return 0, err
			}
		}
	}
	if ahead {
		r.sequential(addr, end, last)
	}
	return len(p), nil
}

// parallelism returns how many goroutines decode blocks of one read.
func (r *Reader) parallelism(blocks []Block) int {
	if len(blocks) < 2 || r.threads == 1 {
		return 1
	}
	var bytes int64
	var compressed int
	for _, b := range blocks {
		bytes += int64(b.Len)
		if b.Kind != codec.Zero && b.Kind != codec.Raw {
			compressed++
		}
	}
	return codec.Threads(r.threads, bytes, compressed)
}

// raWindow is how far from the end of the previous read a read may start
// and still count as sequential: the kernel sends its readahead requests
// for one stream a little out of order.
const raWindow = 4 << 20

// noteRead notes end as the front of the reader and returns the front
// before it. A read that ends a little behind the front (the kernel's
// requests for one stream, served out of order) leaves the front where
// it is.
func (r *Reader) noteRead(end uint64) uint64 {
	for {
		last := r.raLast.Load()
		front := end
		if end < last && last <= end+raWindow {
			front = last
		}
		if r.raLast.CompareAndSwap(last, front) {
			return last
		}
	}
}

// sequential follows a read of [addr, end) (last: the end of the read
// before it) and, when it continues the previous one, keeps up to two
// readahead batches in flight after it.
func (r *Reader) sequential(addr, end, last uint64) {
	if addr+raWindow < last || addr > last+raWindow {
		return
	}
	r.raMu.Lock()
	defer r.raMu.Unlock()
	if r.raNext < end || r.raNext > end+2*readaheadBatch {
		r.raNext = end
	}
	for r.raFlight < 2 && r.raNext < end+2*readaheadBatch {
		lo := r.raNext
		blocks, next := r.batchFrom(lo, readaheadBatch)
		if len(blocks) == 0 {
			r.raNext = ^uint64(0) >> 1 // nothing to decode ahead
			return
		}
		r.raNext = next
		r.raFlight++
		r.raWG.Add(1)
		go r.prefetch(blocks)
	}
}

// batchFrom returns the blocks to decode from addr on, up to max bytes of
// memory, and the address after them: the blocks that take decoding.
// Zero blocks need none, and a Raw block is its stored bytes: the kernel
// (or an object store's file, store/s3) reads the pages file ahead of the
// reads that load them already, and a reader that takes Raw blocks from
// the pages file itself (Reader.Mixed) would never read them here.
func (r *Reader) batchFrom(addr uint64, maxBytes uint64) ([]Block, uint64) {
	var out []Block
	var n uint64
	ri, _ := r.lay.findRun(addr)
	for ; ri < len(r.lay.ix.Runs) && n < maxBytes; ri++ {
		run := r.lay.ix.Runs[ri]
		start := max(addr, run.Addr)
		b, _ := r.lay.blockAt(start)
		for i := b.Index; i < run.FirstBlock+blocksInRange(run.Addr, run.End(), r.lay.ix.BlockSize) && n < maxBytes; i++ {
			blk := r.lay.block(ri, i)
			n += uint64(blk.Len)
			addr = blk.End()
			if blk.Kind != codec.Zero && blk.Kind != codec.Raw {
				out = append(out, blk)
			}
		}
	}
	return out, addr
}

// prefetch decodes blocks into the cache.
func (r *Reader) prefetch(blocks []Block) {
	defer r.raWG.Done()
	defer func() {
		r.raMu.Lock()
		r.raFlight--
		r.raMu.Unlock()
	}()
	g, ctx := errgroup.WithContext(r.ctx)
	g.SetLimit(max(1, r.parallelism(blocks)))
	for _, b := range blocks {
		// A block behind the end of the reader's last read was read
		// already (a reader that keeps what it reads may have served it
		// whole, and it left the cache): decoding it now would be for
		// nobody.
		if r.cache.Contains(cache.Key{File: r.file, Block: b.Index}) || b.End() <= r.raLast.Load() {
			continue
		}
		g.Go(func() error {
			ref, err := r.get(ctx, b)
			if err != nil {
				return err // logged by load; the reader sees it on its own read
			}
			ref.Release()
			return nil
		})
	}
	g.Wait()
}

// Chunk is a decoded block handed to a Stream callback.
type Chunk struct {
	Addr uint64
	Kind codec.Kind
	Data []byte // valid only during the callback
}

// Stream decodes every block that starts in [lo, hi), in address order, in
// bounded parallel batches (codec.DecodeBlocks with the reader's Threads),
// and calls fn with each batch. Zero blocks are passed with Data of zeros
// unless skipZero is set. Stream does not use the cache.
func (r *Reader) Stream(ctx context.Context, lo, hi uint64, skipZero bool, fn func([]Chunk) error) error {
	var blocks []Block
	for b := range r.Blocks() {
		if b.Addr >= hi {
			break
		}
		if b.Addr < lo || (skipZero && b.Kind == codec.Zero) {
			continue
		}
		blocks = append(blocks, b)
	}
	return r.streamBlocks(ctx, blocks, r.auth, fn)
}

// streamBlocks decodes blocks; noCRC leaves their CRC32C unchecked.
func (r *Reader) streamBlocks(ctx context.Context, blocks []Block, noCRC bool, fn func([]Chunk) error) error {
	cb := make([]codec.Block, len(blocks))
	for i, b := range blocks {
		cb[i] = codec.Block{Kind: b.Kind, Off: int64(b.Off), StoredLen: int(b.StoredLen), Len: int(b.Len), CRC: b.CRC}
	}
	var chunks []Chunk
	err := codec.DecodeBlocks(ctx, r.src, cb, codec.DecodeOptions{Threads: r.threads, Authenticated: noCRC}, func(first int, out [][]byte) error {
		chunks = chunks[:0]
		for i, d := range out {
			b := blocks[first+i]
			chunks = append(chunks, Chunk{Addr: b.Addr, Kind: b.Kind, Data: d})
		}
		return fn(chunks)
	})
	var be *codec.BlockError
	if errors.As(err, &be) && be.Index >= 0 && be.Index < len(blocks) {
		return r.blockError(blocks[be.Index], be.Err)
	}
	return err
}

// Verify decodes every block and checks its CRC32C (after its
// authentication, if Authenticated: the command that checks a snapshot
// checks everything). progress, if not nil, is called with the decoded
// bytes checked so far and the total.
func (r *Reader) Verify(ctx context.Context, progress func(done, total uint64)) error {
	var blocks []Block
	for b := range r.Blocks() {
		blocks = append(blocks, b)
	}
	var done uint64
	return r.streamBlocks(ctx, blocks, false, func(c []Chunk) error {
		for _, x := range c {
			done += uint64(len(x.Data))
		}
		if progress != nil {
			progress(done, r.stats.Total.Bytes)
		}
		return nil
	})
}

// FindRun returns the index of the run that holds addr, or of the first
// run after it and false.
func (r *Reader) FindRun(addr uint64) (int, bool) { return r.lay.findRun(addr) }

// VerifyPagesFile checks the whole pages file of pid against the size and
// CRC32C in the manifest (padding included).
func (s *Snapshot) VerifyPagesFile(pid int) error {
	e, err := s.entry(pid)
	if err != nil {
		return err
	}
	f, err := s.OpenFile(e.Pages)
	if err != nil {
		return err
	}
	defer f.Close()
	h := codec.NewChecksum()
	n, err := io.Copy(h, io.NewSectionReader(f, 0, s.Manifest.Files[e.Pages].Size+1))
	if err != nil {
		return fmt.Errorf("read %s: %w", e.Pages, err)
	}
	sum := s.Manifest.Files[e.Pages]
	if got := crcHex(h.Sum32()); n != sum.Size || got != sum.CRC32C {
		return fmt.Errorf("%s: %w: %d bytes crc32c %s, manifest says %d bytes crc32c %s", e.Pages, ErrManifestMismatch, n, got, sum.Size, sum.CRC32C)
	}
	return nil
}
