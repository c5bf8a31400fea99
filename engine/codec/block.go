// Package codec implements the block codec of lazyfs snapshots: the rule that
// decides how a block of memory is stored, and the parallel pipelines that
// encode blocks for a dump and decode them for a restore or a read.
//
// # The block rule
//
// A block is a page-aligned run of at most MaxBlockSize bytes of process
// memory. It is stored as one of four kinds:
//
//	Zero     every byte is zero; nothing is stored
//	LZ4      the LZ4 block encoding, kept only if it is smaller than 7/8 of
//	         the input (it saves more than 12.5%)
//	Shuffle  the block byte-shuffled into planes of 2- or 4-byte elements,
//	         each plane raw, LZ4 or huff0 (see shuffle.go); written only in
//	         the ShuffleLZ4 and ShuffleHuff modes, kept only if it is
//	         smaller than both 7/8 of the input and the LZ4 encoding
//	Raw      the bytes as they are
//
// Every block carries the CRC32C (Castagnoli) of its decoded bytes, checked
// before decoded bytes are handed to anyone.
//
// # Concurrency
//
// Encode and Decode are safe for concurrent use. Pipeline encodes in
// parallel and emits in submission order; DecodeBlocks decodes in bounded
// batches (at most 32 MiB of output per batch, at most two batches in
// flight) with a thread count chosen per batch (see Threads).
package codec

import (
	"bytes"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"sync"

	"github.com/klauspost/compress/huff0"
	"github.com/pierrec/lz4/v4"
)

// PageSize is the page size of every snapshot (x86-64).
const PageSize = 4096

// MaxBlockSize is the largest decoded block the format allows.
const MaxBlockSize = 4 << 20

// DefaultBlockSize is the block size of --compress-block without a size.
const DefaultBlockSize = 256 << 10

// Kind says how a block is stored.
type Kind uint8

const (
	Zero Kind = 0 // all-zero block, nothing stored
	Raw  Kind = 1 // stored as is
	LZ4  Kind = 2 // LZ4 block encoding
	// Shuffle: byte-shuffled planes, each raw, LZ4 or huff0. Snapshots
	// with such blocks need the "shuffle" format feature.
	Shuffle Kind = 3
	// Parent: the block is the parent snapshot's block at the same
	// address, byte for byte (an incremental snapshot, feature "parent");
	// nothing is stored, and it is never decoded by itself: a reader
	// reads it from the parent.
	Parent Kind = 4
	// Forked: the block is, byte for byte, the block at the same address
	// of the process's parent in the same snapshot, a tree's (feature
	// "forked"): memory a child still shared with its parent copy-on-write
	// since fork. Nothing is stored; a reader reads it from the parent.
	Forked Kind = 5
)

// NumKinds is the number of block kinds; Kind values are below it.
const NumKinds = 6

func (k Kind) String() string {
	switch k {
	case Zero:
		return "zero"
	case Raw:
		return "raw"
	case LZ4:
		return "lz4"
	case Shuffle:
		return "shuffle"
	case Parent:
		return "parent"
	case Forked:
		return "forked"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Valid reports whether k is a known kind.
func (k Kind) Valid() bool { return k < NumKinds }

// Mode selects which kinds an encoder may produce.
type Mode uint8

const (
	// Compress applies the full block rule: Zero, LZ4 or Raw.
	Compress Mode = iota
	// NoCompress stores every non-zero block Raw (--no-compress).
	NoCompress
	// ShuffleLZ4 applies the block rule and also tries, per block,
	// Shuffle encodings of 2- and 4-byte elements with LZ4 planes, keeping
	// the smallest.
	ShuffleLZ4
	// ShuffleHuff is ShuffleLZ4 with Huffman-coded (huff0) planes, LZ4
	// where huff0 cannot code a plane: smaller weights, slower to decode.
	ShuffleHuff
)

// DefaultMode is the codec of a dump without --codec.
const DefaultMode = Compress

// Modes are the modes in the order of their numbers, named by String.
var Modes = []Mode{Compress, NoCompress, ShuffleLZ4, ShuffleHuff}

// String is the mode's name in the manifest and on the command line:
// lz4, none, shuffle-lz4 or shuffle-huff.
func (m Mode) String() string {
	switch m {
	case Compress:
		return "lz4"
	case NoCompress:
		return "none"
	case ShuffleLZ4:
		return "shuffle-lz4"
	case ShuffleHuff:
		return "shuffle-huff"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode returns the mode named s (see Mode.String).
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("unknown codec %q (want lz4, shuffle-lz4, shuffle-huff or none)", s)
}

// planeMethod is the plane compression of a shuffling mode, 0 for others.
func (m Mode) planeMethod() int {
	switch m {
	case ShuffleLZ4:
		return planeLZ4
	case ShuffleHuff:
		return planeHuff
	}
	return 0
}

var (
	// ErrChecksum: a block's decoded bytes do not match its CRC32C.
	ErrChecksum = errors.New("block checksum mismatch")
	// ErrUndecodable: a block's stored bytes cannot be decoded to its
	// length (a wrong kind, stored length or LZ4 stream).
	ErrUndecodable = errors.New("corrupt block")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum returns the CRC32C of b, the checksum stored for every block.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// UpdateChecksum returns crc updated with b: the Checksum of data
// written in pieces, starting from 0.
func UpdateChecksum(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }

// NewChecksum returns a hash computing Checksum, for data read as a
// stream.
func NewChecksum() hash.Hash32 { return crc32.New(castagnoli) }

var zeros = make([]byte, 64<<10)

// IsZero reports whether every byte of b is zero.
func IsZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeros))
		if !bytes.Equal(b[:n], zeros[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

// keepLZ4 reports whether an LZ4 encoding of n bytes into c bytes is kept:
// only when it saves more than 12.5%, i.e. c < 7n/8.
func keepLZ4(c, n int) bool { return c > 0 && 8*c < 7*n }

// Encoder holds the scratch state of one encoding goroutine. The zero value
// is ready to use; an Encoder must not be used concurrently.
type Encoder struct {
	c    lz4.Compressor
	hs   *huff0.Scratch // tables of ShuffleHuff planes
	buf  []byte
	sbuf []byte // a Shuffle candidate
	// sample: a block's sample and its planes (planShuffle).
	sample []byte
	// exhaustive, in tests: try both element sizes on every block.
	exhaustive bool
}

// Encode applies the block rule to src. It returns the kind and the stored
// bytes: nil for Zero, src itself for Raw, and for LZ4 and Shuffle a slice
// of the encoder's buffer, valid until the next call to Encode.
func (e *Encoder) Encode(src []byte, mode Mode) (Kind, []byte) {
	k, out, buf := e.encode(src, mode, e.buf)
	e.buf = buf
	return k, out
}

// encode applies the block rule to src, compressing into buf (grown if it
// is too small). It returns the kind, the stored bytes and the buffer, so
// that a caller can keep the compressed output beyond the next call
// (Pipeline).
func (e *Encoder) encode(src []byte, mode Mode, buf []byte) (Kind, []byte, []byte) {
	if IsZero(src) {
		return Zero, nil, buf
	}
	if mode == NoCompress {
		return Raw, src, buf
	}
	// Only an output below 7/8 of the input is kept, so the buffer need not
	// hold the worst case: lz4 reports a too-small buffer as 0 or an error,
	// and both mean Raw.
	limit := 7 * len(src) / 8
	if cap(buf) < limit {
		buf = make([]byte, limit)
	}
	n, err := e.c.CompressBlock(src, buf[:limit])
	kind, best := Raw, len(src)
	if err == nil && keepLZ4(n, len(src)) {
		kind, best = LZ4, n
	}
	if method := mode.planeMethod(); method != 0 {
		elems, raw := shuffleElems[:], uint8(0)
		if len(src) >= sampleMin && !e.exhaustive {
			p := e.planShuffle(src, method, kind == LZ4)
			elems, raw = shuffleElems[:0], p.raw
			if p.elem != 0 {
				elems = []int{p.elem}
			}
		}
		planes := getScratch(len(src))
		for _, elem := range elems {
			e.sbuf = e.encodeShuffled(e.sbuf[:0], src, (*planes)[:len(src)], elem, method, raw)
			if c := len(e.sbuf); keepLZ4(c, len(src)) && c < best {
				kind, best = Shuffle, c
				if cap(buf) < c {
					buf = make([]byte, max(limit, c))
				}
				copy(buf[:c], e.sbuf)
			}
		}
		shuffleScratch.Put(planes)
	}
	if kind == Raw {
		return Raw, src, buf
	}
	return kind, buf[:best], buf
}

var encoders = sync.Pool{New: func() any { return new(Encoder) }}

// Encode applies the block rule to src and appends the stored bytes to dst.
// It is safe for concurrent use.
func Encode(dst, src []byte, mode Mode) (Kind, []byte) {
	e := encoders.Get().(*Encoder)
	k, out := e.Encode(src, mode)
	dst = append(dst, out...)
	encoders.Put(e)
	return k, dst
}

// Decode decodes stored bytes of the given kind into dst, which must have
// exactly the decoded length of the block. It does not check the CRC; see
// DecodeChecked.
func Decode(dst []byte, kind Kind, stored []byte) error {
	switch kind {
	case Zero:
		if len(stored) != 0 {
			return fmt.Errorf("%w: zero block with %d stored bytes", ErrUndecodable, len(stored))
		}
		clear(dst)
	case Raw:
		if len(stored) != len(dst) {
			return fmt.Errorf("%w: raw block of %d bytes, want %d", ErrUndecodable, len(stored), len(dst))
		}
		copy(dst, stored)
	case LZ4:
		n, err := lz4.UncompressBlock(stored, dst)
		if err != nil {
			return fmt.Errorf("%w: lz4: %v", ErrUndecodable, err)
		}
		if n != len(dst) {
			return fmt.Errorf("%w: lz4 block decodes to %d bytes, want %d", ErrUndecodable, n, len(dst))
		}
	case Shuffle:
		return decodeShuffled(dst, stored)
	case Parent:
		return fmt.Errorf("%w: a parent block is read from the parent snapshot", ErrUndecodable)
	case Forked:
		return fmt.Errorf("%w: a forked block is read from the parent process", ErrUndecodable)
	default:
		return fmt.Errorf("%w: unknown kind %d", ErrUndecodable, kind)
	}
	return nil
}

// DecodeChecked decodes like Decode and then checks the CRC32C of dst.
func DecodeChecked(dst []byte, kind Kind, stored []byte, crc uint32) error {
	if err := Decode(dst, kind, stored); err != nil {
		return err
	}
	if got := Checksum(dst); got != crc {
		return fmt.Errorf("%w: crc32c %08x, want %08x", ErrChecksum, got, crc)
	}
	return nil
}
