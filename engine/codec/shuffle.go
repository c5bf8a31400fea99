package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/huff0"
	"github.com/pierrec/lz4/v4"
)

// # Shuffled blocks
//
// Model weights are arrays of 2-byte (bf16, fp16) or 4-byte (float32)
// numbers. Their high bytes (sign and exponent) take few values; their low
// bytes (mantissa) are noise. Interleaved, neither LZ4 nor an entropy coder
// finds much to shrink. A Shuffle block stores the block byte-shuffled into
// E planes (plane j holds byte j of every E-byte element, in order) and
// each plane on its own: raw, or compressed with LZ4 or Huffman-coded
// (huff0, the entropy stage of zstd). The narrow
// planes then compress and the noisy ones cost a copy.
//
// Stored bytes of a Shuffle block (little-endian):
//
//	[0]          E, the element size: 2 or 4
//	[1+5j]       plane j's method: 0 raw, 1 LZ4 block, 2 huff0 chunks
//	[2+5j:6+5j]  plane j's stored length (uint32)
//	[1+5E:]      the planes' stored bytes, plane 0 first
//
// A block of n bytes has planes of n/E bytes; a raw plane stores exactly
// that many. A huff0 plane is cut into chunks of huffChunk bytes (the last
// one shorter), each stored as its length (uint32) and the huff0 4X
// encoding of the chunk, table included. The encoder keeps a Shuffle block only when it is smaller than
// both 7/8 of the block and the block's plain LZ4 encoding.

// Plane methods of a Shuffle block.
const (
	planeRaw  = 0
	planeLZ4  = 1
	planeHuff = 2
)

// huffChunk is the most bytes of a plane in one huff0 encoding (huff0
// takes at most huff0.BlockSizeMax).
const huffChunk = 128 << 10

// shuffleHeader is the length of a Shuffle block's header for element size e.
func shuffleHeader(e int) int { return 1 + 5*e }

// shuffleElems are the element sizes an encoder tries, in order.
var shuffleElems = [...]int{2, 4}

// huffScratch holds the decoding tables of huff0 chunks.
var huffScratch = sync.Pool{New: func() any { return new(huff0.Scratch) }}

// shuffle writes src byte-shuffled with element size e into dst
// (len(dst) == len(src), a multiple of e): plane j, dst[j*n/e:(j+1)*n/e],
// holds src[i*e+j] for every element i.
func shuffle(dst, src []byte, e int) {
	n := len(src) / e
	switch e {
	case 2:
		p0, p1 := dst[:n], dst[n:2*n]
		i := 0
		for ; i+8 <= n; i += 8 {
			a := binary.LittleEndian.Uint64(src[2*i:])
			b := binary.LittleEndian.Uint64(src[2*i+8:])
			binary.LittleEndian.PutUint64(p0[i:], gather2(a)|gather2(b)<<32)
			binary.LittleEndian.PutUint64(p1[i:], gather2(a>>8)|gather2(b>>8)<<32)
		}
		for ; i < n; i++ {
			p0[i], p1[i] = src[2*i], src[2*i+1]
		}
	case 4:
		p0, p1, p2, p3 := dst[:n], dst[n:2*n], dst[2*n:3*n], dst[3*n:4*n]
		i := 0
		for ; i+8 <= n; i += 8 {
			var w [4]uint64
			for k := range 4 {
				x := binary.LittleEndian.Uint64(src[4*i+8*k:])
				for j := range 4 {
					w[j] |= gather4(x>>(8*j)) << (16 * k)
				}
			}
			binary.LittleEndian.PutUint64(p0[i:], w[0])
			binary.LittleEndian.PutUint64(p1[i:], w[1])
			binary.LittleEndian.PutUint64(p2[i:], w[2])
			binary.LittleEndian.PutUint64(p3[i:], w[3])
		}
		for ; i < n; i++ {
			p0[i], p1[i], p2[i], p3[i] = src[4*i], src[4*i+1], src[4*i+2], src[4*i+3]
		}
	default:
		panic(fmt.Sprintf("codec: shuffle element size %d", e))
	}
}

// unshuffle is the inverse of shuffle: planes[j][i] goes to dst[i*e+j],
// e = len(planes), each plane len(dst)/e bytes.
func unshuffle(dst []byte, planes [][]byte) {
	e := len(planes)
	done := unshuffleVector(dst, planes) // elements done, a prefix
	if done*e == len(dst) {
		return
	}
	rest := make([][]byte, e)
	for j, p := range planes {
		rest[j] = p[done:]
	}
	unshuffleWords(dst[done*e:], rest)
}

// unshuffleWords is unshuffle on 8-byte words, for any architecture.
func unshuffleWords(dst []byte, planes [][]byte) {
	e := len(planes)
	n := len(dst) / e
	switch e {
	case 2:
		p0, p1 := planes[0][:n], planes[1][:n]
		i := 0
		for ; i+8 <= n; i += 8 {
			a := binary.LittleEndian.Uint64(p0[i:])
			b := binary.LittleEndian.Uint64(p1[i:])
			binary.LittleEndian.PutUint64(dst[2*i:], spread2(a)|spread2(b)<<8)
			binary.LittleEndian.PutUint64(dst[2*i+8:], spread2(a>>32)|spread2(b>>32)<<8)
		}
		for ; i < n; i++ {
			dst[2*i], dst[2*i+1] = p0[i], p1[i]
		}
	case 4:
		p0, p1, p2, p3 := planes[0][:n], planes[1][:n], planes[2][:n], planes[3][:n]
		i := 0
		for ; i+8 <= n; i += 8 {
			a := binary.LittleEndian.Uint64(p0[i:])
			b := binary.LittleEndian.Uint64(p1[i:])
			c := binary.LittleEndian.Uint64(p2[i:])
			d := binary.LittleEndian.Uint64(p3[i:])
			for k := range 4 {
				s := 16 * k
				binary.LittleEndian.PutUint64(dst[4*i+8*k:],
					spread4(a>>s)|spread4(b>>s)<<8|spread4(c>>s)<<16|spread4(d>>s)<<24)
			}
		}
		for ; i < n; i++ {
			dst[4*i], dst[4*i+1], dst[4*i+2], dst[4*i+3] = p0[i], p1[i], p2[i], p3[i]
		}
	default:
		panic(fmt.Sprintf("codec: unshuffle element size %d", e))
	}
}

// spread2 moves byte k (k < 4) of x to byte 2k, zeroing the others.
func spread2(x uint64) uint64 {
	x &= 0xffffffff
	x = (x | x<<16) & 0x0000ffff0000ffff
	return (x | x<<8) & 0x00ff00ff00ff00ff
}

// gather2 is the inverse of spread2: byte 2k of x to byte k (k < 4).
func gather2(x uint64) uint64 {
	x &= 0x00ff00ff00ff00ff
	x = (x | x>>8) & 0x0000ffff0000ffff
	return (x | x>>16) & 0xffffffff
}

// spread4 moves bytes 0 and 1 of x to bytes 0 and 4, zeroing the others.
func spread4(x uint64) uint64 { return x&0xff | (x&0xff00)<<24 }

// gather4 is the inverse of spread4: bytes 0 and 4 of x to bytes 0 and 1.
func gather4(x uint64) uint64 { return x&0xff | (x>>24)&0xff00 }

// shuffleScratch holds a block's worth of planes while they are encoded or
// decoded.
var shuffleScratch = sync.Pool{New: func() any { return new([]byte) }}

// getScratch returns scratch of at least n bytes from shuffleScratch.
func getScratch(n int) *[]byte {
	b := shuffleScratch.Get().(*[]byte)
	if len(*b) < n {
		*b = make([]byte, n)
	}
	return b
}

// encodeShuffled appends to dst the Shuffle encoding of src with element
// size e, each plane compressed with method (planeLZ4 or planeHuff) where
// that saves more than 12.5% of the plane and stored raw otherwise (a plane
// huff0 cannot code, all one byte value for one, is tried with LZ4), but
// for the planes of raw (bit j for plane j), stored raw without trying.
// planes is scratch of len(src) bytes.
func (e *Encoder) encodeShuffled(dst, src, planes []byte, elem, method int, raw uint8) []byte {
	shuffle(planes, src, elem)
	n := len(src) / elem
	hdr := len(dst)
	dst = append(dst, make([]byte, shuffleHeader(elem))...)
	dst[hdr] = byte(elem)
	for j := range elem {
		p := planes[j*n : (j+1)*n]
		start := len(dst)
		m := planeRaw
		if raw&(1<<j) != 0 {
			dst = append(dst, p...)
			dst[hdr+1+5*j] = byte(m)
			binary.LittleEndian.PutUint32(dst[hdr+2+5*j:], uint32(len(dst)-start))
			continue
		}
		if method == planeHuff {
			var ok bool
			if dst, ok = e.huffPlane(dst, p); ok {
				m = planeHuff
			}
		}
		if m == planeRaw {
			limit := 7 * n / 8
			dst = growCap(dst, limit)
			c, err := e.c.CompressBlock(p, dst[start:start+limit])
			if err == nil && keepLZ4(c, n) {
				dst, m = dst[:start+c], planeLZ4
			}
		}
		if m == planeRaw {
			dst = append(dst[:start], p...)
		}
		dst[hdr+1+5*j] = byte(m)
		binary.LittleEndian.PutUint32(dst[hdr+2+5*j:], uint32(len(dst)-start))
	}
	return dst
}

// huffPlane appends plane p as huff0 chunks to dst. It reports false, with
// dst as it was, when a chunk cannot be coded or the plane does not shrink
// by more than 12.5%.
func (e *Encoder) huffPlane(dst, p []byte) ([]byte, bool) {
	if e.hs == nil {
		e.hs = new(huff0.Scratch)
	}
	// Every chunk carries its own table: the decoder reads chunks alone.
	e.hs.Reuse = huff0.ReusePolicyNone
	start := len(dst)
	for off := 0; off < len(p); off += huffChunk {
		out, _, err := huff0.Compress4X(p[off:min(off+huffChunk, len(p))], e.hs)
		if err != nil {
			return dst[:start], false
		}
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(out)))
		dst = append(dst, out...)
		if !keepLZ4(len(dst)-start, len(p)) && off+huffChunk >= len(p) {
			return dst[:start], false
		}
	}
	return dst, true
}

// decodeHuffPlane decodes the huff0 chunks of stored into out, whose
// length is the plane's.
func decodeHuffPlane(out, stored []byte) error {
	hs := huffScratch.Get().(*huff0.Scratch)
	defer huffScratch.Put(hs)
	for off := 0; off < len(out); off += huffChunk {
		size := min(huffChunk, len(out)-off)
		if len(stored) < 4 {
			return errors.New("chunk length missing")
		}
		c := binary.LittleEndian.Uint32(stored)
		if uint64(c) > uint64(len(stored)-4) {
			return fmt.Errorf("chunk of %d bytes, %d left", c, len(stored)-4)
		}
		hs.MaxDecodedSize = size
		s, rest, err := huff0.ReadTable(stored[4:4+c], hs)
		if err != nil {
			return err
		}
		got, err := s.Decoder().Decompress4X(out[off:off:off+size], rest)
		if err != nil {
			return err
		}
		if len(got) != size {
			return fmt.Errorf("chunk decodes to %d bytes, want %d", len(got), size)
		}
		stored = stored[4+c:]
	}
	if len(stored) != 0 {
		return fmt.Errorf("%d bytes after the last chunk", len(stored))
	}
	return nil
}

// growCap returns b with room for at least n more bytes beyond its length.
func growCap(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b
	}
	nb := make([]byte, len(b), len(b)+n+len(b)/2)
	copy(nb, b)
	return nb
}

// decodeShuffled decodes the stored bytes of a Shuffle block into dst.
func decodeShuffled(dst, stored []byte) error {
	if len(stored) < 1 {
		return fmt.Errorf("%w: shuffle block without header", ErrUndecodable)
	}
	elem := int(stored[0])
	if elem != 2 && elem != 4 {
		return fmt.Errorf("%w: shuffle element size %d", ErrUndecodable, elem)
	}
	if len(dst)%elem != 0 {
		return fmt.Errorf("%w: shuffle block of %d bytes, element size %d", ErrUndecodable, len(dst), elem)
	}
	h := shuffleHeader(elem)
	if len(stored) < h {
		return fmt.Errorf("%w: shuffle header of %d bytes, want %d", ErrUndecodable, len(stored), h)
	}
	n := len(dst) / elem
	var planes [4][]byte
	var scratch *[]byte
	defer func() {
		if scratch != nil {
			shuffleScratch.Put(scratch)
		}
	}()
	body := stored[h:]
	for j := range elem {
		m := stored[1+5*j]
		l := binary.LittleEndian.Uint32(stored[2+5*j:])
		if uint64(l) > uint64(len(body)) {
			return fmt.Errorf("%w: shuffle plane %d of %d bytes, %d left", ErrUndecodable, j, l, len(body))
		}
		p := body[:l]
		body = body[l:]
		if m == planeRaw {
			if len(p) != n {
				return fmt.Errorf("%w: raw plane %d of %d bytes, want %d", ErrUndecodable, j, len(p), n)
			}
			planes[j] = p
			continue
		}
		if scratch == nil {
			scratch = getScratch(len(dst))
		}
		out := (*scratch)[j*n : (j+1)*n : (j+1)*n]
		switch m {
		case planeLZ4:
			got, err := lz4.UncompressBlock(p, out)
			if err != nil {
				return fmt.Errorf("%w: lz4 plane %d: %v", ErrUndecodable, j, err)
			}
			if got != n {
				return fmt.Errorf("%w: lz4 plane %d decodes to %d bytes, want %d", ErrUndecodable, j, got, n)
			}
		case planeHuff:
			if err := decodeHuffPlane(out, p); err != nil {
				return fmt.Errorf("%w: huff0 plane %d: %v", ErrUndecodable, j, err)
			}
		default:
			return fmt.Errorf("%w: shuffle plane %d has method %d", ErrUndecodable, j, m)
		}
		planes[j] = out
	}
	if len(body) != 0 {
		return fmt.Errorf("%w: %d bytes after the shuffle planes", ErrUndecodable, len(body))
	}
	unshuffle(dst, planes[:elem])
	return nil
}
