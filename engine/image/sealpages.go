package image

import (
	"crypto/cipher"
	"encoding/binary"
	"fmt"
	"io"
	"os"
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
	name   string
	f      *os.File
	aead   cipher.AEAD
	id     [idSize]byte
	pid    uint64
	blocks []Block // stored blocks, by offset
	tags   []byte  // tagSize per block of the index
}

func newSealedPages(name string, f *os.File, lay *layout, k *sealKeys, pid int, tags []byte) (*sealedPages, error) {
	if uint64(len(tags)) != uint64(len(lay.ix.Blocks))*tagSize {
		return nil, fmt.Errorf("%w: %d bytes of block tags for %d blocks", ErrCorrupt, len(tags), len(lay.ix.Blocks))
	}
	s := &sealedPages{name: name, f: f, aead: k.pagesAEAD(pid), id: k.id, pid: uint64(pid), tags: tags}
	for ri, r := range lay.ix.Runs {
		n := blocksInRange(r.Addr, r.End(), lay.ix.BlockSize)
		for j := uint64(0); j < n; j++ {
			if b := lay.block(ri, r.FirstBlock+j); b.Kind != codec.Zero {
				s.blocks = append(s.blocks, b)
			}
		}
	}
	return s, nil
}

// sealedBufPool holds the buffers sealed reads read ciphertext into.
var sealedBufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1<<20); return &b }}

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
	rlo, rhi := lo, hi
	if i < j {
		rlo = min(lo, s.blocks[i].Off)
		rhi = max(hi, s.blocks[j-1].Off+uint64(s.blocks[j-1].StoredLen))
	}
	bp := sealedBufPool.Get().(*[]byte)
	defer sealedBufPool.Put(bp)
	if need := int(rhi-rlo) + tagSize; cap(*bp) < need {
		*bp = make([]byte, need)
	}
	buf := (*bp)[:rhi-rlo+tagSize]
	n, err := s.f.ReadAt(buf[:rhi-rlo], int64(rlo))
	if err != nil && uint64(n) < rhi-rlo {
		if i < j && s.blocks[j-1].Off+uint64(s.blocks[j-1].StoredLen) > rlo+uint64(n) {
			return 0, err // a block is cut short
		}
		if uint64(n) < lo-rlo {
			return 0, err
		}
	}
	// Padding and whatever lies outside every block, as stored.
	copy(p, buf[lo-rlo:min(hi, rlo+uint64(n))-rlo])
	var nonce [nonceSize]byte
	var ad [blockADSize]byte
	var save [tagSize]byte
	for _, b := range s.blocks[i:j] {
		ct := buf[b.Off-rlo : b.Off-rlo+uint64(b.StoredLen)+tagSize]
		end := ct[b.StoredLen:]
		copy(save[:], end)
		copy(end, s.tags[b.Index*tagSize:(b.Index+1)*tagSize])
		whole := b.Off >= lo && b.Off+uint64(b.StoredLen) <= hi
		var dst []byte
		if whole {
			dst = p[b.Off-lo : b.Off-lo : b.Off-lo+uint64(b.StoredLen)]
		} else {
			dst = make([]byte, 0, b.StoredLen)
		}
		out, err := s.aead.Open(dst, blockNonce(&nonce, b.Index), ct,
			blockAD(&ad, s.id, s.pid, b.Index, b.Addr, b.Len, b.Kind, b.StoredLen))
		copy(end, save[:])
		if err != nil {
			return 0, &BlockError{File: s.name, Block: b.Index, Addr: b.Addr, Err: ErrAuth}
		}
		if !whole {
			from, to := max(lo, b.Off), min(hi, b.Off+uint64(b.StoredLen))
			copy(p[from-lo:to-lo], out[from-b.Off:to-b.Off])
		}
	}
	if uint64(n) < hi-rlo {
		return int(uint64(n) - (lo - rlo)), io.EOF
	}
	return len(p), nil
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
