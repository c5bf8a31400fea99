package image

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image/seal"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

// Options are the encoding settings of a new snapshot.
type Options struct {
	// BlockSize is the largest decoded block: a power of two from 4 KiB
	// (--compress) to 4 MiB. Zero means codec.DefaultBlockSize.
	BlockSize int
	// Mode is the codec: codec.Compress (lz4), codec.NoCompress
	// (--no-compress), codec.ShuffleLZ4 or codec.ShuffleHuff.
	Mode codec.Mode
	// Workers encode in parallel; zero means GOMAXPROCS.
	Workers int
	// Tool is recorded in the manifest (name and version).
	Tool string
	// Kernel is recorded in the manifest; zero means the running kernel.
	Kernel Kernel
	// Remote configures the store of a snapshot created at an address
	// (s3://BUCKET/PREFIX) rather than in a directory.
	Remote store.Options
	// Seal, if set, makes a sealed snapshot (feature "sealed"):
	// encrypted and authenticated for its recipients.
	Seal *SealOptions
	// Sign, if set, signs the snapshot with this key (feature
	// "signed"): integrity and origin, with or without Seal.
	Sign ed25519.PrivateKey
	// Parent, if set, makes an incremental snapshot (feature "parent",
	// parent.go) of the snapshot at this path or address: blocks whose
	// bytes the parent holds at the same address are not stored again.
	// Not with Seal or Sign. BlockSize zero then means the parent's.
	Parent string
}

// Writer creates a snapshot directory. Files appear as they are written;
// the manifest is written last, by Commit, so that a snapshot whose dump
// failed is never mistaken for a whole one.
//
// Every file is created through the directory's descriptor, exclusively
// (O_EXCL) and without following a symbolic link, and the directory is
// locked (flock) from Create to Commit or Abort: whoever can write the
// directory's parent cannot redirect a file, and two dumps into one
// directory cannot both succeed.
//
// A snapshot created at an address (IsRemote) is written to the store its
// scheme opens (StoreWriter), with the same order: files as they are
// written, the manifest last.
type Writer struct {
	dir string
	// created: Create made the directory, which Abort removes.
	created bool
	dfd     *os.File          // the directory, locked
	remote  store.StoreWriter // or the store, for an address
	opts    Options
	m       Manifest
	files   []string // written so far, for Abort
	done    bool
	keys    *seal.Keys         // of a sealed snapshot
	signer  ed25519.PrivateKey // of a signed snapshot
	parent  *Snapshot          // of an incremental snapshot
	// forked and indexes are for a tree's copy-on-write memory
	// (forked.go): what each child shares with its parent, and the index
	// of each process's pages written so far.
	forked  map[int]forkedFrom
	indexes map[int]*layout
}

// Create starts a snapshot in dir. A missing dir is created (mode 0700:
// memory images hold secrets, as do the process's paths and environment);
// an existing one must be an empty directory, not a symbolic link, owned
// by the caller and writable by nobody else (ErrUnsafeDir), and not in use
// by another dump (ErrLocked). A directory that holds a snapshot, or the
// files of a dump that was killed, is refused (ErrExists).
func Create(dir string, opts Options) (*Writer, error) {
	var parent *Snapshot
	var ref *ParentRef
	if opts.Parent != "" {
		var err error
		if parent, ref, err = openParentForDump(dir, &opts); err != nil {
			return nil, err
		}
	}
	w, err := create(dir, opts)
	if err != nil {
		if parent != nil {
			parent.Close()
		}
		return nil, err
	}
	if parent != nil {
		w.parent, w.m.Parent = parent, ref
		w.addFeature(FeatureParent)
	}
	return w, nil
}

func create(dir string, opts Options) (*Writer, error) {
	if opts.BlockSize == 0 {
		opts.BlockSize = codec.DefaultBlockSize
	}
	if !validBlockSize(uint64(opts.BlockSize)) {
		return nil, fmt.Errorf("block size %d: must be a power of two from %d to %d", opts.BlockSize, MinBlockSize, MaxBlockSize)
	}
	if opts.Workers <= 0 {
		opts.Workers = runtime.GOMAXPROCS(0)
	}
	var dfd *os.File
	var remote store.StoreWriter
	created := false
	if store.IsRemote(dir) {
		var err error
		if remote, err = store.Create(dir, opts.Remote); err != nil {
			return nil, err
		}
	} else {
		var err error
		if dfd, created, err = openNewDir(dir); err != nil {
			return nil, err
		}
	}
	if opts.Kernel == (Kernel{}) {
		opts.Kernel = runningKernel()
	}
	compression := opts.Mode.String()
	w := &Writer{dir: dir, dfd: dfd, created: created, remote: remote, opts: opts, m: Manifest{
		Format:      manifestFormat,
		Version:     manifestVersion,
		Tool:        opts.Tool,
		Created:     time.Now().UTC(),
		Kernel:      opts.Kernel,
		PageSize:    PageSize,
		BlockSize:   opts.BlockSize,
		Compression: compression,
		Files:       map[string]FileSum{},
	}}
	if opts.Sign != nil {
		w.signer = opts.Sign
		w.addFeature(FeatureSigned)
		w.m.Signature = &Signature{Alg: seal.SignAlg, Digest: seal.SignDigest, Key: seal.SignerKeyLine(opts.Sign.Public().(ed25519.PublicKey))}
	}
	if opts.Seal != nil {
		if err := w.startSeal(opts.Seal); err != nil {
			w.Abort()
			return nil, err
		}
	}
	return w, nil
}

// startSeal makes the data key of a sealed snapshot and writes it,
// wrapped for the recipients.
func (w *Writer) startSeal(o *SealOptions) error {
	data, id := seal.NewDataKey()
	wrapped, err := seal.WrapKey(o.Recipients, data, id)
	if err != nil {
		return err
	}
	if err := w.writeFile(KeysName, wrapped); err != nil {
		return err
	}
	w.keys = seal.NewKeys(data, id)
	w.addFeature(FeatureSealed)
	w.m.Seal = &Seal{ID: fmt.Sprintf("%x", id), AEAD: seal.AEAD, KDF: seal.KDF, Wrap: seal.Wrap, Recipients: o.Names}
	if uint64(w.opts.BlockSize) > seal.Window && !o.whole {
		w.m.Seal.Window = seal.Window
		w.addFeature(FeatureSealedWindows)
	}
	return nil
}

// openNewDir makes or opens the snapshot directory dir, checks it (see
// Create) and locks it; created says it made it. Missing parents are made
// as mkdir -p makes them (0755 less the umask): only the snapshot's own
// directory is private.
func openNewDir(dir string) (f *os.File, created bool, err error) {
	if parent := filepath.Dir(dir); parent != dir {
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return nil, false, fmt.Errorf("create snapshot directory: %w", err)
		}
	}
	created = true
	if err := unix.Mkdir(dir, 0o700); errors.Is(err, unix.EEXIST) {
		created = false
	} else if err != nil {
		return nil, false, fmt.Errorf("create snapshot directory %s: %w", dir, err)
	}
	defer func() {
		if err != nil && created {
			unix.Rmdir(dir)
		}
	}()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, created, fmt.Errorf("%w: %s is a symbolic link or not a directory", ErrUnsafeDir, dir)
		}
		return nil, created, fmt.Errorf("open snapshot directory %s: %w", dir, err)
	}
	f = os.NewFile(uintptr(fd), dir)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, created, fmt.Errorf("%s: %w", dir, ErrLocked)
		}
		return nil, created, fmt.Errorf("lock snapshot directory %s: %w", dir, err)
	}
	if err := checkNewDir(f, created); err != nil {
		f.Close()
		return nil, created, err
	}
	return f, created, nil
}

// checkNewDir checks an open snapshot directory: the caller's, writable
// by nobody else, empty.
func checkNewDir(f *os.File, created bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return err
	}
	if euid := uint32(os.Geteuid()); st.Uid != euid {
		return fmt.Errorf("%w: %s belongs to uid %d, not to the caller (uid %d)", ErrUnsafeDir, f.Name(), st.Uid, euid)
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("%w: %s is writable by group or others (mode %04o): dump into a directory only you can write", ErrUnsafeDir, f.Name(), st.Mode&0o7777)
	}
	if created {
		return nil
	}
	names, err := f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read snapshot directory %s: %w", f.Name(), err)
	}
	// Say what it holds: a snapshot, what a dump that did not finish
	// left, or other files.
	if more, err := f.Readdirnames(maxListed); err == nil || errors.Is(err, io.EOF) {
		names = append(names, more...)
	}
	slices.Sort(names)
	if slices.Contains(names, ManifestName) {
		return fmt.Errorf("%w: %s (it has %s): remove it, or dump into a new or empty directory", ErrExists, f.Name(), ManifestName)
	}
	for _, n := range names {
		if DumpFile(n) {
			return fmt.Errorf("%w: %s holds the files of a dump that did not finish (%s): remove them (rm -r %s), or dump into a new or empty directory",
				ErrNotEmpty, f.Name(), n, f.Name())
		}
	}
	what := names[0]
	if len(names) > 1 {
		what = fmt.Sprintf("%s and %d more", names[0], len(names)-1)
	}
	return fmt.Errorf("%w: %s holds %s, which no dump wrote: dump into a new or empty directory", ErrNotEmpty, f.Name(), what)
}

// maxListed bounds the names a refusal of a directory reads.
const maxListed = 64

// DumpFile reports whether name is one of the files a dump writes
// besides the manifest (a dump that did not finish leaves them).
func DumpFile(name string) bool {
	for _, p := range []string{"pages-", "pagemap-", "pagecrc-", "process-", "digests-"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return name == KeysName || name == AuthName
}

// Dir returns the snapshot directory.
func (w *Writer) Dir() string { return w.dir }

// addFeature records that the snapshot needs format feature f (one of
// knownFeatures) to be read right; Commit writes the sorted set.
func (w *Writer) addFeature(f string) {
	if !knownFeatures[f] {
		panic("image: unknown format feature " + f)
	}
	if !slices.Contains(w.m.Features, f) {
		w.m.Features = append(w.m.Features, f)
		slices.Sort(w.m.Features)
	}
}

// createFile creates one file of the snapshot, exclusively, in the
// directory it holds open.
func (w *Writer) createFile(name string) (*os.File, error) {
	fd, err := unix.Openat(int(w.dfd.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, &os.PathError{Op: "create", Path: filepath.Join(w.dir, name), Err: err}
	}
	w.files = append(w.files, name)
	return os.NewFile(uintptr(fd), filepath.Join(w.dir, name)), nil
}

// writeFile writes a whole small file and records its sum.
func (w *Writer) writeFile(name string, b []byte) error {
	if err := w.putFile(name, b); err != nil {
		return err
	}
	sum := FileSum{Size: int64(len(b)), CRC32C: crcHex(codec.Checksum(b))}
	if w.signer != nil {
		d := sha256.Sum256(b)
		sum.SHA256 = hex.EncodeToString(d[:])
	}
	w.m.Files[name] = sum
	return nil
}

// putFile writes the whole small file name, to the directory (synced) or
// the store, without recording it in the manifest.
func (w *Writer) putFile(name string, b []byte) error {
	if w.remote != nil {
		up, err := w.remote.Create(name)
		if err != nil {
			return err
		}
		if _, err := up.Write(b); err != nil {
			up.Abort()
			return fmt.Errorf("write %s: %w", name, err)
		}
		return up.Close()
	}
	f, err := w.createFile(name)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

func crcHex(c uint32) string { return fmt.Sprintf("%08x", c) }

// entry returns the manifest entry of pid, adding it if needed.
func (w *Writer) entry(pid int) *ProcessEntry {
	for i := range w.m.Processes {
		if w.m.Processes[i].PID == pid {
			return &w.m.Processes[i]
		}
	}
	e := ProcessEntry{PID: pid, State: stateName(pid), Index: indexName(pid), Pages: pagesName(pid)}
	if w.keys != nil {
		e.State, e.Index = sealedStateName(pid), sealedIndexName(pid)
	} else if w.signer != nil {
		e.Digests = digestsName(pid)
	}
	w.m.Processes = append(w.m.Processes, e)
	return &w.m.Processes[len(w.m.Processes)-1]
}

// WriteState writes process-PID.json.
func (w *Writer) WriteState(p *Process) error {
	// What every reader refuses is never written: the dump fails instead
	// of committing a snapshot that restore would turn down.
	if err := p.Validate(); err != nil {
		return fmt.Errorf("%w: process %d: %s", ErrStateRefused, p.PID, strings.TrimPrefix(err.Error(), ErrCorrupt.Error()+": "))
	}
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return fmt.Errorf("encode process state: %w", err)
	}
	e := w.entry(p.PID)
	for _, f := range p.features() {
		w.addFeature(f)
	}
	if len(p.NSPID) > 0 {
		w.addFeature(FeaturePIDNS)
	}
	if len(p.Namespaces) > 0 {
		w.addFeature(FeatureNamespaces)
	}
	b = append(b, '\n')
	if w.keys != nil {
		b = sealFile(w.keys, roleState, p.PID, b, 0)
	}
	return w.writeFile(e.State, b)
}

// Commit writes the manifest, atomically, syncs the directory and
// unlocks it. After Commit the snapshot is complete.
func (w *Writer) Commit() error {
	for _, p := range w.m.Processes {
		for _, name := range p.files() {
			if _, ok := w.m.Files[name]; !ok {
				return fmt.Errorf("commit: process %d has no %s", p.PID, name)
			}
		}
	}
	b, err := json.MarshalIndent(&w.m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	if w.keys != nil || w.signer != nil {
		// Before the manifest: a snapshot is whole once it has one.
		if err := w.writeAuth(append(b, '\n')); err != nil {
			return err
		}
	}
	if w.remote != nil {
		if err := w.remote.Commit(append(b, '\n')); err != nil {
			return fmt.Errorf("commit manifest: %w", err)
		}
		w.done = true
		w.closeParent()
		return nil
	}
	tmp := fmt.Sprintf(".%s.%d-%x.tmp", ManifestName, os.Getpid(), rand.Uint64())
	if err := w.writeFile(tmp, append(b, '\n')); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	delete(w.m.Files, tmp)
	dfd := int(w.dfd.Fd())
	if err := unix.Renameat2(dfd, tmp, dfd, ManifestName, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			err = ErrExists
		}
		return fmt.Errorf("commit manifest: %w", err)
	}
	w.files = slices.DeleteFunc(w.files, func(n string) bool { return n == tmp }) // the manifest now
	w.done = true
	w.closeParent()
	err = w.dfd.Sync()
	if cerr := w.dfd.Close(); err == nil { // and unlock
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", w.dir, err)
	}
	return nil
}

// Abort removes the files written so far and unlocks the directory; the
// directory itself is left. It does nothing after a successful Commit.
func (w *Writer) Abort() {
	if w.done {
		return
	}
	w.closeParent()
	if w.remote != nil {
		w.remote.Abort()
		w.done = true
		return
	}
	for _, name := range w.files {
		unix.Unlinkat(int(w.dfd.Fd()), name, 0)
	}
	w.files = nil
	w.done = true
	w.dfd.Close()
	if w.created {
		// Made for this dump: nothing of it is left (unless another
		// program wrote into it meanwhile).
		unix.Rmdir(w.dir)
	}
}

// PagesWriter streams the memory of one process into pagemap-PID.img and
// pages-PID.img. Ranges are added in increasing address order; contiguous
// ranges form one run. Blocks are encoded in parallel and written in order.
type PagesWriter struct {
	w      *Writer
	pid    int
	bs     uint64
	f      *os.File // nil when the pages go to a StoreWriter
	buf    pagesSink
	crc    uint32
	off    uint64
	pipe   *codec.Pipeline
	chunks sync.Pool
	ctx    context.Context
	cancel context.CancelFunc

	ix      Index
	sealer  *seal.Sealer // of a sealed snapshot
	digests bool         // of a signed snapshot in clear
	tags    []byte       // per block: the tag of a sealed snapshot, the SHA-256 of a signed one
	end     uint64       // end of the last run
	brk     bool         // the next Add starts a new run
	// nblocks is the number of blocks the runs so far hold; submitted
	// the number submitted to the pipeline.
	nblocks, submitted uint64
	// pageCRCs are the page checksums of the Raw blocks so far, when
	// blocks are longer than a page (FeaturePageCRC) and the snapshot is
	// in clear (pcrc).
	pcrc     bool
	pageCRCs []uint32
	// parent reads the parent's pages of the process, of an incremental
	// snapshot.
	parent *Reader
	// forked: blocks the process's parent in the tree holds are recorded
	// as Forked (forked.go).
	forked bool
	stats  [codec.NumKinds]KindStats
	closed bool
	err    error
}

// chunkSize is how much memory a fill call reads at once: large reads
// are much cheaper than one system call per 4 KiB block.
const chunkSize = 4 << 20

// chunk is a buffer shared by the blocks cut from it; it goes back to the
// pool when the last of them has been written.
type chunk struct {
	b    []byte
	refs atomic.Int32
}

// Pages starts the page image of pid. Only one PagesWriter may be open at
// a time.
func (w *Writer) Pages(ctx context.Context, pid int) (*PagesWriter, error) {
	parent, err := w.parentPages(pid)
	if err != nil {
		return nil, err
	}
	pw, err := w.pages(ctx, pid, parent)
	if err != nil && parent != nil {
		parent.Close()
	}
	return pw, err
}

func (w *Writer) pages(ctx context.Context, pid int, parent *Reader) (*PagesWriter, error) {
	var f *os.File
	var buf pagesSink
	if w.remote != nil {
		up, err := w.remote.Create(pagesName(pid))
		if err != nil {
			return nil, fmt.Errorf("create pages file: %w", err)
		}
		buf = uploadSink{up}
	} else {
		var err error
		if f, err = w.createFile(pagesName(pid)); err != nil {
			return nil, fmt.Errorf("create pages file: %w", err)
		}
		buf = newSeqWriter(f)
	}
	w.entry(pid)
	ctx, cancel := context.WithCancel(ctx)
	pw := &PagesWriter{w: w, pid: pid, bs: uint64(w.opts.BlockSize), f: f, buf: buf, ctx: ctx, cancel: cancel, parent: parent}
	pw.ix.BlockSize = pw.bs
	pw.chunks.New = func() any { return &chunk{b: make([]byte, max(chunkSize, w.opts.BlockSize))} }
	// Page checksums are of the plaintext, read without the block they
	// are in: a sealed or signed snapshot has none (they would leak what
	// they sum, and a page cannot be authenticated without its whole
	// block).
	pw.pcrc = pw.bs > PageSize && w.keys == nil && w.signer == nil
	po := codec.PipelineOptions{Workers: w.opts.Workers, Mode: w.opts.Mode, PageChecksums: pw.pcrc}
	if w.keys != nil {
		pw.sealer = &seal.Sealer{AEAD: w.keys.Pages(pid), Window: w.m.Seal.Window}
		po.Seal = func(e *codec.Encoded, buf []byte) ([]byte, error) {
			t := e.Tag.(*blockTag)
			b := seal.Block{ID: w.keys.ID, PID: uint64(pid), Index: t.index, Addr: t.addr, Len: uint32(len(e.Src)), Kind: byte(e.Kind), Stored: uint32(len(e.Stored))}
			return pw.sealer.Seal(buf, &b, e.Kind == codec.Raw, e.Stored), nil
		}
	} else if w.signer != nil {
		pw.digests = true
		po.Seal = func(e *codec.Encoded, buf []byte) ([]byte, error) { return seal.AppendDigest(buf, e.Stored), nil }
	}
	if parent != nil {
		po.InParent = (&parentMatcher{r: parent}).inParent
	} else if m := w.forkedMatcher(pid); m != nil {
		// Emitted as Parent, recorded as Forked (emit).
		po.InParent, pw.forked = m.inParent, true
	}
	pw.pipe = codec.NewPipeline(ctx, po, pw.emit)
	return pw, nil
}

var zeroPad [rawAlign]byte

// zeroTag stands in the tag table for a Zero block, which stores nothing.
var zeroTag [seal.TagSize]byte

// blockTag goes with a block through the pipeline: its chunk and, for
// the seal, its identity.
type blockTag struct {
	c     *chunk
	index uint64
	addr  uint64
}

// emit writes one encoded block; it runs on one goroutine, in order.
func (pw *PagesWriter) emit(e *codec.Encoded) error {
	c := e.Tag.(*blockTag).c
	defer func() {
		if c.refs.Add(-1) == 0 {
			pw.chunks.Put(c)
		}
	}()
	rec := BlockRecord{Kind: e.Kind, CRC: e.CRC}
	if pw.forked && e.Kind == codec.Parent {
		rec.Kind = codec.Forked
	}
	if e.Kind == codec.Raw {
		if pad := alignUp(pw.off, rawAlign) - pw.off; pad > 0 {
			if err := pw.write(zeroPad[:pad]); err != nil {
				return err
			}
		}
	}
	stored := e.Stored
	if pw.sealer != nil {
		var tag []byte
		if e.Kind != codec.Zero {
			stored, tag = e.Sealed[:len(e.Stored)], e.Sealed[len(e.Stored):]
		}
		pw.tags = append(pw.tags, tag...)
		if tag == nil {
			pw.tags = append(pw.tags, zeroTag[:]...)
		}
	} else if pw.digests {
		if e.Kind == codec.Zero {
			pw.tags = append(pw.tags, make([]byte, seal.DigestSize)...)
		} else {
			pw.tags = append(pw.tags, e.Sealed...)
		}
	}
	if e.Kind != codec.Zero && e.Kind != codec.Parent {
		rec.StoredLen = uint32(len(stored))
		if err := pw.write(stored); err != nil {
			return err
		}
	}
	pw.ix.Blocks = append(pw.ix.Blocks, rec)
	pw.pageCRCs = append(pw.pageCRCs, e.PageCRCs...)
	s := &pw.stats[rec.Kind]
	s.Blocks++
	s.Bytes += uint64(len(e.Src))
	s.Stored += uint64(rec.StoredLen)
	return nil
}

func (pw *PagesWriter) write(b []byte) error {
	if _, err := pw.buf.Write(b); err != nil {
		return err // names the file
	}
	pw.crc = codec.UpdateChecksum(pw.crc, b)
	pw.off += uint64(len(b))
	return nil
}

// pipeError words an error of the encoding pipeline: a failed write of
// the pages file is passed on as it is, naming the file.
func pipeError(err error) error {
	if _, ok := errors.AsType[*os.PathError](err); ok {
		return err
	}
	return fmt.Errorf("encode pages: %w", err)
}

// writebackChunk is how much data written through the page cache starts
// writeback at once: the disk writes while the dump goes on, and Close's
// fsync has little left to do (it took ~0.4 s per 768 MiB at the end of a
// dump on the reference machine, ~10 ms with this).
const writebackChunk = 16 << 20

// Add adds the pages [addr, addr+length) to the image. fill is called
// with consecutive pieces of the range, in order, to read their contents
// into dst (len(dst) is a multiple of the page size). addr and length must
// be page aligned, and addr at or after the end of the previous range.
func (pw *PagesWriter) Add(addr, length uint64, fill func(dst []byte, addr uint64) error) error {
	if pw.err != nil {
		return pw.err
	}
	if pw.closed {
		return errors.New("add pages: writer closed")
	}
	switch {
	case addr%PageSize != 0 || length%PageSize != 0:
		return fmt.Errorf("add pages: range %#x+%#x is not page aligned", addr, length)
	case length == 0:
		return nil
	case addr < pw.end:
		return fmt.Errorf("add pages: range at %#x before the end of the previous one (%#x)", addr, pw.end)
	case addr >= maxAddr || length > maxAddr-addr:
		return fmt.Errorf("add pages: range %#x+%#x outside the address space", addr, length)
	}
	if n := len(pw.ix.Runs); n > 0 && pw.ix.Runs[n-1].End() == addr && !pw.brk {
		r := &pw.ix.Runs[n-1]
		pw.nblocks -= blocksInRange(r.Addr, r.End(), pw.bs)
		r.Pages += length / PageSize
		pw.nblocks += blocksInRange(r.Addr, r.End(), pw.bs)
	} else {
		pw.ix.Runs = append(pw.ix.Runs, Run{Addr: addr, Pages: length / PageSize, FirstBlock: pw.nblocks})
		pw.nblocks += blocksInRange(addr, addr+length, pw.bs)
	}
	end := addr + length
	pw.end = end
	pw.brk = false
	for a := addr; a < end; {
		// A chunk is a whole number of blocks, cut at block boundaries
		// of the address space.
		c := pw.chunks.Get().(*chunk)
		cend := min(end, (a/pw.bs)*pw.bs+uint64(len(c.b)))
		n := cend - a
		if err := fill(c.b[:n], a); err != nil {
			pw.chunks.Put(c)
			return pw.fail(fmt.Errorf("read memory at %#x: %w", a, err))
		}
		var blocks []uint64 // block boundaries inside the chunk
		for b := a; b < cend; {
			e := min(cend, (b/pw.bs+1)*pw.bs)
			blocks = append(blocks, b, e)
			b = e
		}
		c.refs.Store(int32(len(blocks) / 2))
		for i := 0; i < len(blocks); i += 2 {
			lo, hi := blocks[i]-a, blocks[i+1]-a
			if err := pw.pipe.Submit(c.b[lo:hi], &blockTag{c: c, index: pw.submitted, addr: blocks[i]}); err != nil {
				return pw.fail(pipeError(err))
			}
			pw.submitted++
		}
		a = cend
	}
	return nil
}

// Break ends the current run: the next Add starts a new one even if it
// continues the last. The dumper breaks at every VMA boundary so that no
// block spans two VMAs.
func (pw *PagesWriter) Break() { pw.brk = true }

func (pw *PagesWriter) fail(err error) error {
	if pw.err == nil {
		pw.err = err
		pw.cancel()
	}
	return pw.err
}

// Stats returns the figures of the blocks written so far (complete after
// Close).
func (pw *PagesWriter) Stats() Stats {
	s := newStats(pw.stats)
	s.FileSize = pw.off
	s.Runs = len(pw.ix.Runs)
	return s
}

// Close flushes the pages, writes the index, and records both files in the
// manifest.
func (pw *PagesWriter) Close() error {
	if pw.closed {
		return pw.err
	}
	pw.closed = true
	defer pw.cancel()
	if pw.parent != nil {
		defer pw.parent.Close()
	}
	pw.finishPages()
	if pw.err != nil {
		return pw.err
	}
	e := pw.w.entry(pw.pid)
	lay, err := pw.writeIndex(e)
	if err != nil {
		return pw.fail(err)
	}
	if err := pw.writeSideFiles(lay, e); err != nil {
		return pw.fail(err)
	}
	pw.w.m.Files[pagesName(pw.pid)] = FileSum{Size: int64(pw.off), CRC32C: crcHex(pw.crc)}
	var pages uint64
	for _, r := range pw.ix.Runs {
		pages += r.Pages
	}
	e.Pages4K, e.StoredBytes = pages, pw.off
	return nil
}

// finishPages ends the pipeline and the pages file: flushed and synced
// unless the writer failed, closed either way. Errors go to pw.fail.
func (pw *PagesWriter) finishPages() {
	if err := pw.pipe.Close(); err != nil {
		pw.fail(pipeError(err))
	}
	if pw.err != nil {
		pw.buf.Abort()
	} else {
		if err := pw.buf.Flush(); err != nil {
			pw.fail(err) // names the file
		} else if pw.f != nil {
			if err := pw.f.Sync(); err != nil {
				pw.fail(fmt.Errorf("sync %s: %w", pagesName(pw.pid), err))
			}
		}
	}
	if pw.f != nil {
		if err := pw.f.Close(); err != nil {
			pw.fail(fmt.Errorf("close %s: %w", pagesName(pw.pid), err))
		}
	}
}

// writeIndex writes the index of the pages, e.Index (sealed with the
// blocks' tags, if the snapshot is), checked first as a reader checks
// it, and returns its layout.
func (pw *PagesWriter) writeIndex(e *ProcessEntry) (*layout, error) {
	if got, want := uint64(len(pw.ix.Blocks)), pw.nblocks; got != want {
		return nil, fmt.Errorf("pages of %d: %d blocks written, runs need %d", pw.pid, got, want)
	}
	pw.ix.PagesSize = pw.off
	b, err := pw.ix.MarshalBinary()
	if err != nil {
		return nil, err
	}
	// Re-parse what is about to be written: the writer must never produce
	// an index the reader refuses.
	if _, err := UnmarshalIndex(b, int64(pw.off)); err != nil {
		return nil, fmt.Errorf("index of %d fails its own check: %w", pw.pid, err)
	}
	lay, err := newLayout(&pw.ix)
	if err != nil {
		return nil, fmt.Errorf("index of %d fails its own check: %w", pw.pid, err)
	}
	if pw.sealer != nil {
		b = sealFile(pw.w.keys, roleIndex, pw.pid, append(b, pw.tags...), len(pw.tags))
	}
	if err := pw.w.writeFile(e.Index, b); err != nil {
		return nil, err
	}
	return lay, nil
}

// writeSideFiles records what the blocks written need (features), keeps
// the layout lay for the Forked blocks of the process's children, and
// writes the page checksums or the blocks' digests, if the snapshot has
// them, naming them in e.
func (pw *PagesWriter) writeSideFiles(lay *layout, e *ProcessEntry) error {
	if pw.stats[codec.Shuffle].Blocks > 0 {
		pw.w.addFeature(FeatureShuffle)
	}
	if pw.stats[codec.Forked].Blocks > 0 {
		pw.w.addFeature(FeatureForked)
	}
	if pw.w.indexes == nil {
		pw.w.indexes = map[int]*layout{}
	}
	pw.w.indexes[pw.pid] = lay
	if pw.pcrc {
		// Checked like the index: the writer must never produce a file
		// the reader refuses.
		if _, err := newPageCRCs(lay, pw.pageCRCs); err != nil {
			return fmt.Errorf("page checksums of %d fail their own check: %w", pw.pid, err)
		}
		if err := pw.w.writeFile(pageCRCName(pw.pid), marshalPageCRCs(pw.pageCRCs)); err != nil {
			return err
		}
		e.PageCRCs = pageCRCName(pw.pid)
		pw.w.addFeature(FeaturePageCRC)
	}
	if pw.digests {
		return pw.w.writeFile(e.Digests, pw.tags)
	}
	return nil
}

// pagesSink is where a PagesWriter's bytes go, in order: a seqWriter on
// the pages file, or an upload to a store.
type pagesSink interface {
	Write(b []byte) (int, error)
	// Flush writes what is buffered and completes the file.
	Flush() error
	// Abort drops what is buffered.
	Abort()
}

// uploadSink writes the pages to an Upload, which buffers and sends them
// as the dump goes on.
type uploadSink struct{ up store.Upload }

func (u uploadSink) Write(b []byte) (int, error) { return u.up.Write(b) }
func (u uploadSink) Flush() error                { return u.up.Close() }
func (u uploadSink) Abort()                      { u.up.Abort() }
