package image

import (
	"bytes"
	"crypto/cipher"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"

	"github.com/lazyfs/lazyfs/engine/image/seal"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

// sealedPages is the pages file of a sealed snapshot as an io.ReaderAt of
// plaintext payloads at their offsets: every block a read touches is read
// whole, authenticated and decrypted; the padding between payloads reads
// as stored (zeros). Every reader of payloads (Reader, Uncached, Stream,
// the restore's fill) reads through it, so a block is never handed on
// before it authenticates. Safe for concurrent use.
type sealedPages struct {
	name    string
	f       store.File
	aead    cipher.AEAD // nil: a signed snapshot in clear, blocks checked by SHA-256
	id      [seal.IDSize]byte
	pid     uint64
	blocks  []Block    // the stored blocks, by offset
	units   []sealUnit // of the stored blocks, by offset
	tags    []byte     // tagLen per unit and Zero block, in index order: GCM tags, or SHA-256 (aead nil)
	tagLen  int
	maxLen  int // the largest unit, for the scratch buffers
	scratch chan []byte
}

// newSealedPages returns the pages file f of process pid read through
// the keys of a sealed snapshot, its Raw blocks sealed in windows of
// window bytes (0: all whole), tags being the blocks' GCM tags; or, k
// nil, of a signed snapshot in clear, tags being the blocks' SHA-256.
func newSealedPages(name string, f store.File, lay *layout, k *seal.Keys, window uint64, pid int, tags []byte) (*sealedPages, error) {
	s := &sealedPages{name: name, f: f, pid: uint64(pid), tags: tags, tagLen: seal.DigestSize,
		scratch: make(chan []byte, sealedScratch)}
	if k != nil {
		s.aead, s.id, s.tagLen = k.Pages(pid), k.ID, seal.TagSize
	} else {
		window = 0
	}
	blocks, units, want, err := sealUnits(lay, window, s.tagLen)
	if err != nil {
		return nil, err
	}
	s.blocks = blocks
	if uint64(len(tags)) != want {
		return nil, fmt.Errorf("%w: %d bytes of block tags or digests for %d blocks, want %d", ErrAuth, len(tags), len(lay.ix.Blocks), want)
	}
	s.units = units
	for _, u := range units {
		s.maxLen = max(s.maxLen, int(u.n))
	}
	return s, nil
}

// Forget passes on to the pages file (Forgetter): a block that fails its
// authentication may be one its cache kept wrong.
func (s *sealedPages) Forget(off, n int64) bool {
	fg, ok := s.f.(Forgetter)
	return ok && fg.Forget(off, n)
}

// sealedScratch is how many block-sized buffers a sealedPages keeps for
// blocks it cannot decrypt in place. They are kept, not pooled: memory
// freed and faulted in again is what costs most on a machine that hands
// free pages back to its host.
const sealedScratch = 16

// ReadAt reads the payloads [off, off+len(p)) straight into p, then
// authenticates and decrypts each block in place (openInPlace). A block cut
// by either end of the read, or at its end with no room after it in p
// for its tag (every single-block read), is read apart: into a scratch
// buffer, and decrypted from there into p.
func (s *sealedPages) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read %s at %d: negative offset", s.name, off)
	}
	lo, hi := uint64(off), uint64(off)+uint64(len(p))
	i := sort.Search(len(s.units), func(i int) bool { return s.units[i].end() > lo })
	j := i
	for j < len(s.units) && s.units[j].off < hi {
		j++
	}
	var apart []*sealUnit // in file order
	if i < j && s.units[i].off < lo {
		apart = append(apart, &s.units[i])
		i++
	}
	for k := 0; i < j; k++ {
		u := &s.units[j-1]
		if end := u.end(); end <= hi && (s.aead == nil || end+seal.TagSize <= hi) {
			break
		}
		apart = slices.Insert(apart, len(apart)-k, u)
		j--
	}
	// Read the rest: the blocks decrypted in place and the padding around
	// them. A read past the end of the file, after the last block, returns
	// what it read and io.EOF, once the blocks are authenticated.
	count, eof := len(p), error(nil)
	from := lo
	for k := 0; k <= len(apart); k++ {
		to := hi
		if k < len(apart) {
			to = apart[k].off
		}
		if from < to {
			n, err := s.f.ReadAt(p[from-lo:to-lo], int64(from))
			if err != nil && (k < len(apart) || !errors.Is(err, io.EOF) || i < j && s.units[j-1].end() > from+uint64(n)) {
				if errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF // a block is cut short
				}
				return 0, err
			}
			if err != nil {
				count, eof = int(from-lo)+n, err
			}
		}
		if k < len(apart) {
			from = max(from, apart[k].end())
		}
	}
	for _, u := range apart {
		if err := s.partial(u, p, lo); err != nil {
			return 0, err
		}
	}
	if s.aead == nil {
		for k := i; k < j; k++ {
			u := &s.units[k]
			if err := s.check(u, p[u.off-lo:u.end()-lo]); err != nil {
				return 0, err
			}
		}
	} else if err := s.openInPlace(s.units[i:j], p, lo); err != nil {
		return 0, err
	}
	return count, eof
}

// openInPlace authenticates and decrypts in place blocks bs, read into p
// (read at lo) with room for a tag after each. AES-GCM wants a block's
// tag right after its ciphertext: the 16 bytes after a block in p (the
// next block's, or padding) are set aside while the tag stands there.
func (s *sealedPages) openInPlace(us []sealUnit, p []byte, lo uint64) error {
	var save [seal.TagSize]byte
	for k := range us {
		u := &us[k]
		at := u.off - lo
		end := at + uint64(u.n)
		copy(save[:], p[end:end+seal.TagSize])
		copy(p[end:end+seal.TagSize], s.tag(u))
		_, err := s.open(u, p[at:at], p[at:end+seal.TagSize])
		copy(p[end:end+seal.TagSize], save[:])
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *sealedPages) tag(u *sealUnit) []byte {
	return s.tags[u.tag : u.tag+uint64(s.tagLen)]
}

// check compares the stored bytes of block u with its SHA-256 (signed
// snapshots in clear).
func (s *sealedPages) check(u *sealUnit, stored []byte) error {
	if d := sha256.Sum256(stored); !bytes.Equal(d[:], s.tag(u)) {
		b := &s.blocks[u.blk]
		return &BlockError{File: s.name, Block: b.Index, Addr: b.Addr, Err: ErrAuth}
	}
	return nil
}

// open authenticates and decrypts unit u, ciphertext and tag in ct,
// appending the plaintext to dst.
func (s *sealedPages) open(u *sealUnit, dst, ct []byte) ([]byte, error) {
	b := &s.blocks[u.blk]
	id := seal.Block{ID: s.id, PID: s.pid, Index: b.Index, Addr: b.Addr, Len: b.Len, Kind: byte(b.Kind), Stored: b.StoredLen}
	out, err := seal.Open(s.aead, dst, ct, &id, u.win)
	if err != nil {
		return nil, &BlockError{File: s.name, Block: b.Index, Addr: b.Addr, Err: ErrAuth}
	}
	return out, nil
}

// partial reads unit u whole into a scratch buffer, authenticates and
// decrypts it, and copies what of it falls in p (read at lo): straight
// from the scratch buffer into p if all of it does.
func (s *sealedPages) partial(u *sealUnit, p []byte, lo uint64) error {
	n := int(u.n)
	var buf []byte
	select {
	case buf = <-s.scratch:
	default:
	}
	if cap(buf) < n+seal.TagSize {
		// Every buffer fits every unit: kept, none is made again.
		buf = make([]byte, max(n, s.maxLen)+seal.TagSize)
	}
	defer func() {
		select {
		case s.scratch <- buf:
		default:
		}
	}()
	buf = buf[:n+seal.TagSize]
	if _, err := s.f.ReadAt(buf[:n], int64(u.off)); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		b := &s.blocks[u.blk]
		return &BlockError{File: s.name, Block: b.Index, Addr: b.Addr, Err: err}
	}
	out := buf[:n]
	if s.aead == nil {
		if err := s.check(u, out); err != nil {
			return err
		}
	} else {
		copy(buf[n:], s.tag(u))
		if u.off >= lo && u.end() <= lo+uint64(len(p)) {
			_, err := s.open(u, p[u.off-lo:u.off-lo], buf)
			return err
		}
		var err error
		if out, err = s.open(u, buf[:0], buf); err != nil {
			return err
		}
	}
	from, to := max(lo, u.off), min(lo+uint64(len(p)), u.end())
	if from < to {
		copy(p[from-lo:to-lo], out[from-u.off:to-u.off])
	}
	return nil
}
