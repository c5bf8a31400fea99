package image

import (
	"fmt"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image/seal"
)

// Sealed windows (the "sealed-windows" format feature): a sealed
// snapshot's Raw blocks larger than Seal.Window are sealed window by
// window (seal.Window; see package seal for the windows' nonces and
// associated data), so that a lazy restore's fault reads, authenticates
// and places the window around the faulting page instead of the whole
// block. The windows' ciphertexts follow each other where the block's
// payload stands (the pages file keeps its layout); their tags take the
// block's place in the index's tag table, in order, 16 bytes each.

// FeatureSealedWindows is the format feature of a sealed snapshot whose
// Raw blocks are sealed in windows (Seal.Window).
const FeatureSealedWindows = "sealed-windows"

func init() { knownFeatures[FeatureSealedWindows] = true }

// checkSealWindow validates the seal's window against the features and
// the block size.
func checkSealWindow(m *Manifest) error {
	w := m.Seal.Window
	if m.HasFeature(FeatureSealedWindows) != (w != 0) {
		return fmt.Errorf("%w: feature %q and the seal's window (%d) disagree", ErrCorrupt, FeatureSealedWindows, w)
	}
	if w != 0 && (w%PageSize != 0 || w >= uint64(m.BlockSize)) {
		return fmt.Errorf("%w: seal window of %d bytes for blocks of %d", ErrCorrupt, w, m.BlockSize)
	}
	return nil
}

// windowed reports whether a block of kind and stored length n is
// sealed in windows of w bytes (w 0: none is).
func windowed(w uint64, kind codec.Kind, n uint32) bool {
	return seal.Windowed(w, kind == codec.Raw, n)
}

// sealUnit is what one AES-GCM message of a pages file covers: a block
// sealed whole, or one window of a block sealed in windows.
type sealUnit struct {
	off uint64 // of its stored bytes in the pages file
	tag uint64 // offset of its tag in the tag table
	n   uint32 // its stored bytes
	win uint32 // window number from 1; 0: the whole block
	blk uint32 // its block, in sealedPages.blocks
}

func (u *sealUnit) end() uint64 { return u.off + uint64(u.n) }

// sealUnits returns the stored blocks of lay and their units, in file
// order, and the length their tag table must have (tagLen bytes per block
// sealed whole or Zero, per window of a block sealed in windows of w
// bytes). The slices are made at their size: a restore opens a snapshot
// more than once, and memory made anew is slow on some hosts.
func sealUnits(lay *layout, w uint64, tagLen int) ([]Block, []sealUnit, uint64, error) {
	var nb, nu int
	for _, rec := range lay.ix.Blocks {
		switch {
		case rec.Kind == codec.Zero:
		case windowed(w, rec.Kind, rec.StoredLen):
			nb, nu = nb+1, nu+int(seal.Windows(w, rec.StoredLen))
		default:
			nb, nu = nb+1, nu+1
		}
	}
	blocks := make([]Block, 0, nb)
	units := make([]sealUnit, 0, nu)
	var tag uint64
	next := uint64(0)
	for ri, r := range lay.ix.Runs {
		n := blocksInRange(r.Addr, r.End(), lay.ix.BlockSize)
		for j := uint64(0); j < n; j++ {
			b := lay.block(ri, r.FirstBlock+j)
			if b.Index != next {
				return nil, nil, 0, fmt.Errorf("%w: block %d where block %d was expected", ErrCorrupt, b.Index, next)
			}
			next++
			if b.Kind == codec.Zero {
				tag += uint64(tagLen)
				continue
			}
			bi := uint32(len(blocks))
			blocks = append(blocks, b)
			if !windowed(w, b.Kind, b.StoredLen) {
				units = append(units, sealUnit{blk: bi, off: b.Off, n: b.StoredLen, tag: tag})
				tag += uint64(tagLen)
				continue
			}
			for win := uint64(0); win < seal.Windows(w, b.StoredLen); win++ {
				n := min(uint64(b.StoredLen)-win*w, w)
				units = append(units, sealUnit{blk: bi, win: uint32(win + 1), off: b.Off + win*w, n: uint32(n), tag: tag})
				tag += uint64(tagLen)
			}
		}
	}
	return blocks, units, tag, nil
}

// windowed reports whether block b is sealed in windows.
func (r *Reader) windowed(b Block) bool { return windowed(r.window, b.Kind, b.StoredLen) }

// sealedWindow returns the window of block b (sealed in windows) that
// holds addr.
func (r *Reader) sealedWindow(b Block, addr uint64) (lo, hi uint64) {
	lo = b.Addr + (addr-b.Addr)/r.window*r.window
	return lo, min(b.End(), lo+r.window)
}
