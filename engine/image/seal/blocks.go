package seal

import (
	"crypto/cipher"
	"encoding/binary"
)

// Block is the identity a block is sealed under, its associated data:
// a block authenticates only as itself (snapshot, process, index,
// address, length, kind and stored length). Its nonce is its index,
// unique under the per-process key (each block is sealed once).
type Block struct {
	ID     [IDSize]byte
	PID    uint64
	Index  uint64
	Addr   uint64
	Len    uint32 // decoded
	Kind   byte
	Stored uint32 // stored length
}

const blockADSize = IDSize + 8 + 8 + 8 + 4 + 1 + 4

func (b *Block) ad(ad *[blockADSize]byte) []byte {
	le := binary.LittleEndian
	copy(ad[:], b.ID[:])
	le.PutUint64(ad[16:], b.PID)
	le.PutUint64(ad[24:], b.Index)
	le.PutUint64(ad[32:], b.Addr)
	le.PutUint32(ad[40:], b.Len)
	ad[44] = b.Kind
	le.PutUint32(ad[45:], b.Stored)
	return ad[:]
}

// Sealed windows (the "sealed-windows" format feature): a sealed
// snapshot's Raw blocks larger than its window are sealed window by
// window, each window (the last one of a block possibly shorter) an
// AES-256-GCM message of its own, so that a lazy restore's fault reads,
// authenticates and places the window around the faulting page, as page
// checksums let a snapshot in clear do, instead of the whole block. The
// windows' ciphertexts follow each other where the block's payload stands
// (the pages file keeps its layout); their tags take the block's place in
// the index's tag table, in order, 16 bytes each. A window's nonce is the
// block's (its index) with the window's number plus one in bytes 8-11,
// and its associated data the block's identity followed by that number (4
// bytes): a window authenticates only as itself, in its block, and never
// as a whole block. Other blocks are sealed whole, as without the
// feature.

// Window is the window size a sealed snapshot's Raw blocks are written
// in: the fault window of a lazy restore (a multiple of the page size,
// at most a block's largest size, 4 MiB).
const Window = 16 << 10

// Windowed reports whether a block of stored length n is sealed in
// windows of w bytes (w 0: none is); raw says it is a Raw block, the
// only kind sealed in windows.
func Windowed(w uint64, raw bool, n uint32) bool {
	return w != 0 && raw && uint64(n) > w
}

// Windows returns the number of windows of w bytes in n bytes.
func Windows(w uint64, n uint32) uint64 { return (uint64(n) + w - 1) / w }

// nonce returns the nonce of window win (from 1; 0: the whole block) of
// block index.
func nonce(n *[NonceSize]byte, index uint64, win uint32) []byte {
	binary.LittleEndian.PutUint64(n[:], index)
	binary.LittleEndian.PutUint32(n[8:], win)
	return n[:]
}

const windowADSize = blockADSize + 4

// windowAD is the associated data of window win of a block, from the
// block's.
func windowAD(ad *[windowADSize]byte, block []byte, win uint32) []byte {
	copy(ad[:], block)
	binary.LittleEndian.PutUint32(ad[blockADSize:], win)
	return ad[:]
}

// Sealer encrypts the blocks of one process at dump time.
type Sealer struct {
	AEAD   cipher.AEAD // the process's (Keys.Pages)
	Window uint64      // Raw blocks larger than it are sealed in windows; 0: none
}

// Seal encrypts stored, the stored bytes of block b (raw: a Raw block),
// into buf and returns ciphertext and tag, or the ciphertext and tags of
// its windows.
func (s *Sealer) Seal(buf []byte, b *Block, raw bool, stored []byte) []byte {
	if Windowed(s.Window, raw, uint32(len(stored))) {
		return s.sealWindows(buf, b, stored)
	}
	var n [NonceSize]byte
	var ad [blockADSize]byte
	return s.AEAD.Seal(buf, nonce(&n, b.Index, 0), stored, b.ad(&ad))
}

// maxWindows is the most windows a block holds: a block is at most 4 MiB,
// a window at least a page.
const maxWindows = (4 << 20) / (4 << 10)

// sealWindows appends to buf the ciphertext of stored, the bytes of Raw
// block b, window by window, then the windows' tags.
func (s *Sealer) sealWindows(buf []byte, b *Block, stored []byte) []byte {
	var bad [blockADSize]byte
	block := b.ad(&bad)
	n := Windows(s.Window, uint32(len(stored)))
	var tagBuf [TagSize * maxWindows]byte
	tags := tagBuf[:0]
	for win := uint64(0); win < n; win++ {
		part := stored[win*s.Window : min(uint64(len(stored)), (win+1)*s.Window)]
		var nc [NonceSize]byte
		var ad [windowADSize]byte
		buf = s.AEAD.Seal(buf, nonce(&nc, b.Index, uint32(win+1)), part, windowAD(&ad, block, uint32(win+1)))
		tags = append(tags, buf[len(buf)-TagSize:]...)
		buf = buf[:len(buf)-TagSize]
	}
	return append(buf, tags...)
}

// Open authenticates and decrypts window win (from 1; 0: the whole
// block) of block b, ciphertext and tag in ct, appending the plaintext to
// dst. Any failure is ErrAuth.
func Open(aead cipher.AEAD, dst, ct []byte, b *Block, win uint32) ([]byte, error) {
	var n [NonceSize]byte
	var ad [blockADSize]byte
	bad := b.ad(&ad)
	if win != 0 {
		var wad [windowADSize]byte
		bad = windowAD(&wad, bad, win)
	}
	out, err := aead.Open(dst, nonce(&n, b.Index, win), ct, bad)
	if err != nil {
		return nil, ErrAuth
	}
	return out, nil
}
