package image

import (
	"bytes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sort"
	"sync"

	"github.com/lazyfs/lazyfs/engine/codec"
)

// blockAD is the associated data of a block: its identity, so that a
// block authenticates only as itself (snapshot, process, index, address,
// length, kind and stored length).
const blockADSize = idSize + 8 + 8 + 8 + 4 + 1 + 4

func blockAD(ad *[blockADSize]byte, id [idSize]byte, pid uint64, index, addr uint64, length uint32, kind codec.Kind, stored uint32) []byte {
	le := binary.LittleEndian
	copy(ad[:], id[:])
	le.PutUint64(ad[16:], pid)
	le.PutUint64(ad[24:], index)
	le.PutUint64(ad[32:], addr)
	le.PutUint32(ad[40:], length)
	ad[44] = byte(kind)
	le.PutUint32(ad[45:], stored)
	return ad[:]
}

// blockNonce is block index's nonce: the index, unique under the
// per-process key (each block is sealed once).
func blockNonce(n *[nonceSize]byte, index uint64) []byte {
	binary.LittleEndian.PutUint64(n[:], index)
	return n[:]
}

// sealedPages is the pages file of a sealed snapshot as an io.ReaderAt of
// plaintext payloads at their offsets: every block a read touches is read
// whole, authenticated and decrypted; the padding between payloads reads
// as stored (zeros). Every reader of payloads (Reader, Uncached, Stream,
// the restore's fill) reads through it, so a block is never handed on
// before it authenticates. Safe for concurrent use.
type sealedPages struct {
	name    string
	f       File
	aead    cipher.AEAD // nil: a signed snapshot in clear, blocks checked by SHA-256
	id      [idSize]byte
	pid     uint64
	blocks  []Block // stored blocks, by offset
	tags    []byte  // tagLen per block of the index: GCM tags, or SHA-256 (aead nil)
	tagLen  int
	maxLen  int // the largest stored block, for the scratch buffers
	scratch chan []byte
}

// newSealedPages returns the pages file f of process pid read through
// the keys of a sealed snapshot, tags being the blocks' GCM tags; or, k
// nil, of a signed snapshot in clear, tags being the blocks' SHA-256.
func newSealedPages(name string, f File, lay *layout, k *sealKeys, pid int, tags []byte) (*sealedPages, error) {
	s := &sealedPages{name: name, f: f, pid: uint64(pid), tags: tags, tagLen: digestSize,
		scratch: make(chan []byte, sealedScratch)}
	if k != nil {
		s.aead, s.id, s.tagLen = k.pagesAEAD(pid), k.id, tagSize
	}
	if uint64(len(tags)) != uint64(len(lay.ix.Blocks))*uint64(s.tagLen) {
		return nil, fmt.Errorf("%w: %d bytes of block tags or digests for %d blocks", ErrAuth, len(tags), len(lay.ix.Blocks))
	}
	for ri, r := range lay.ix.Runs {
		n := blocksInRange(r.Addr, r.End(), lay.ix.BlockSize)
		for j := uint64(0); j < n; j++ {
			if b := lay.block(ri, r.FirstBlock+j); b.Kind != codec.Zero {
				s.blocks = append(s.blocks, b)
				s.maxLen = max(s.maxLen, int(b.StoredLen))
			}
		}
	}
	return s, nil
}

// sealedScratch is how many block-sized buffers a sealedPages keeps for
// blocks it cannot decrypt in place. They are kept, not pooled: memory
// freed and faulted in again is what costs most on a machine that hands
// free pages back to its host.
const sealedScratch = 16

// ReadAt reads the payloads [off, off+len(p)) straight into p, then
// authenticates and decrypts each block in place (openAll). A block cut
// by either end of the read, or at its end with no room after it in p
// for its tag (every single-block read), is read apart: into a scratch
// buffer, and decrypted from there into p.
func (s *sealedPages) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read %s at %d: negative offset", s.name, off)
	}
	lo, hi := uint64(off), uint64(off)+uint64(len(p))
	i := sort.Search(len(s.blocks), func(i int) bool { return s.blocks[i].Off+uint64(s.blocks[i].StoredLen) > lo })
	j := i
	for j < len(s.blocks) && s.blocks[j].Off < hi {
		j++
	}
	var apart []Block // in file order
	if i < j && s.blocks[i].Off < lo {
		apart = append(apart, s.blocks[i])
		i++
	}
	for k := 0; i < j; k++ {
		b := s.blocks[j-1]
		if end := b.Off + uint64(b.StoredLen); end <= hi && (s.aead == nil || end+tagSize <= hi) {
			break
		}
		apart = slices.Insert(apart, len(apart)-k, b)
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
			to = apart[k].Off
		}
		if from < to {
			n, err := s.f.ReadAt(p[from-lo:to-lo], int64(from))
			if err != nil && (k < len(apart) || !errors.Is(err, io.EOF) || i < j && s.blocks[j-1].Off+uint64(s.blocks[j-1].StoredLen) > from+uint64(n)) {
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
			from = max(from, apart[k].Off+uint64(apart[k].StoredLen))
		}
	}
	for _, b := range apart {
		if err := s.partial(b, p, lo); err != nil {
			return 0, err
		}
	}
	if s.aead == nil {
		for _, b := range s.blocks[i:j] {
			if err := s.check(b, p[b.Off-lo:b.Off-lo+uint64(b.StoredLen)]); err != nil {
				return 0, err
			}
		}
	} else if err := s.openAll(s.blocks[i:j], p, lo); err != nil {
		return 0, err
	}
	return count, eof
}

// sealedParallel is the least ciphertext a read decrypts on more than
// one goroutine (at most GOMAXPROCS): below it, starting goroutines
// costs more than the decryption.
const sealedParallel = 1 << 20

// openAll authenticates and decrypts in place blocks bs, read whole into
// p (read at lo) with room for a tag after each. A large read is
// decrypted on several goroutines, each a group of consecutive blocks but
// its last, whose tag would stand over the first bytes of the next group
// while another goroutine opens them: those last blocks are opened once
// all the rest is.
func (s *sealedPages) openAll(bs []Block, p []byte, lo uint64) error {
	if len(bs) == 0 {
		return nil
	}
	total := bs[len(bs)-1].Off + uint64(bs[len(bs)-1].StoredLen) - bs[0].Off
	parts := min(runtime.GOMAXPROCS(0), len(bs)/2, int(total/sealedParallel))
	if parts <= 1 {
		return s.openInPlace(bs, p, lo)
	}
	// Cut bs into parts groups of about total/parts bytes each.
	groups := make([][]Block, 0, parts)
	start := 0
	for k := range bs {
		if len(groups) < parts-1 && bs[k].Off+uint64(bs[k].StoredLen)-bs[start].Off >= total/uint64(parts) {
			groups = append(groups, bs[start:k+1])
			start = k + 1
		}
	}
	if start < len(bs) {
		groups = append(groups, bs[start:])
	}
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for g := range groups[1:] {
		wg.Go(func() { errs[g+1] = s.openInPlace(groups[g+1][:len(groups[g+1])-1], p, lo) })
	}
	errs[0] = s.openInPlace(groups[0][:len(groups[0])-1], p, lo)
	wg.Wait()
	for g, err := range errs {
		if err == nil {
			err = s.openInPlace(groups[g][len(groups[g])-1:], p, lo)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// openInPlace authenticates and decrypts in place blocks bs, read into p
// (read at lo) with room for a tag after each. AES-GCM wants a block's
// tag right after its ciphertext: the 16 bytes after a block in p (the
// next block's, or padding) are set aside while the tag stands there.
func (s *sealedPages) openInPlace(bs []Block, p []byte, lo uint64) error {
	var save [tagSize]byte
	for _, b := range bs {
		at := b.Off - lo
		end := at + uint64(b.StoredLen)
		copy(save[:], p[end:end+tagSize])
		copy(p[end:end+tagSize], s.tag(b))
		_, err := s.open(b, p[at:at], p[at:end+tagSize])
		copy(p[end:end+tagSize], save[:])
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *sealedPages) tag(b Block) []byte {
	return s.tags[b.Index*uint64(s.tagLen) : (b.Index+1)*uint64(s.tagLen)]
}

// check compares the stored bytes of block b with its SHA-256 (signed
// snapshots in clear).
func (s *sealedPages) check(b Block, stored []byte) error {
	if d := sha256.Sum256(stored); !bytes.Equal(d[:], s.tag(b)) {
		return &BlockError{File: s.name, Block: b.Index, Addr: b.Addr, Err: ErrAuth}
	}
	return nil
}

// open authenticates and decrypts block b, ciphertext and tag in ct,
// appending the plaintext to dst.
func (s *sealedPages) open(b Block, dst, ct []byte) ([]byte, error) {
	var nonce [nonceSize]byte
	var ad [blockADSize]byte
	out, err := s.aead.Open(dst, blockNonce(&nonce, b.Index), ct, blockAD(&ad, s.id, s.pid, b.Index, b.Addr, b.Len, b.Kind, b.StoredLen))
	if err != nil {
		return nil, &BlockError{File: s.name, Block: b.Index, Addr: b.Addr, Err: ErrAuth}
	}
	return out, nil
}

// partial reads block b whole into a scratch buffer, authenticates and
// decrypts it, and copies what of it falls in p (read at lo): straight
// from the scratch buffer into p if all of it does.
func (s *sealedPages) partial(b Block, p []byte, lo uint64) error {
	n := int(b.StoredLen)
	var buf []byte
	select {
	case buf = <-s.scratch:
	default:
	}
	if cap(buf) < n+tagSize {
		// Every buffer fits every block: kept, none is made again.
		buf = make([]byte, max(n, s.maxLen)+tagSize)
	}
	defer func() {
		select {
		case s.scratch <- buf:
		default:
		}
	}()
	buf = buf[:n+tagSize]
	if _, err := s.f.ReadAt(buf[:n], int64(b.Off)); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return &BlockError{File: s.name, Block: b.Index, Addr: b.Addr, Err: err}
	}
	out := buf[:n]
	if s.aead == nil {
		if err := s.check(b, out); err != nil {
			return err
		}
	} else {
		copy(buf[n:], s.tag(b))
		if b.Off >= lo && b.Off+uint64(n) <= lo+uint64(len(p)) {
			_, err := s.open(b, p[b.Off-lo:b.Off-lo], buf)
			return err
		}
		var err error
		if out, err = s.open(b, buf[:0], buf); err != nil {
			return err
		}
	}
	from, to := max(lo, b.Off), min(lo+uint64(len(p)), b.Off+uint64(n))
	if from < to {
		copy(p[from-lo:to-lo], out[from-b.Off:to-b.Off])
	}
	return nil
}

// blockSealer encrypts the blocks of one process at dump time (the
// pipeline's Seal hook) and keeps their tags.
type blockSealer struct {
	aead cipher.AEAD
	id   [idSize]byte
	pid  uint64
}

// seal encrypts stored, the stored bytes of block index at addr, into
// buf and returns ciphertext and tag.
func (s *blockSealer) seal(buf []byte, index, addr uint64, length uint32, kind codec.Kind, stored []byte) []byte {
	var nonce [nonceSize]byte
	var ad [blockADSize]byte
	return s.aead.Seal(buf, blockNonce(&nonce, index), stored,
		blockAD(&ad, s.id, s.pid, index, addr, length, kind, uint32(len(stored))))
}
