package image

import (
	"encoding/binary"
	"fmt"

	"github.com/lazyfs/lazyfs/engine/codec"
)

// FeaturePageCRC is the format feature of snapshots whose processes have
// a page-checksum file: the CRC32C of every 4 KiB page of every Raw block
// longer than a page, in block order. A reader that needs a page or a few
// of a big Raw block (a lazy restore serving a fault) then reads and
// checks those pages only, instead of the whole block. Readers that do
// not know the feature must refuse the snapshot: they would not check
// what the file claims, and a writer that relies on it may skip nothing
// else, but a snapshot is one format for every reader.
const FeaturePageCRC = "page-crc"

func init() { knownFeatures[FeaturePageCRC] = true }

// Page-checksum file format: a header, then one little-endian uint32 per
// page.
const (
	pageCRCMagic      = "LZFSPCRC"
	pageCRCVersion    = 1
	pageCRCHeaderSize = 24 // magic, version u16, reserved u16, page size u32, count u64
	// maxPageCRCs bounds the count read, before any allocation.
	maxPageCRCs = maxBlocks
)

func pageCRCName(pid int) string { return fmt.Sprintf("pagecrc-%d.img", pid) }

func marshalPageCRCs(crcs []uint32) []byte {
	b := make([]byte, pageCRCHeaderSize+4*len(crcs))
	le := binary.LittleEndian
	copy(b, pageCRCMagic)
	le.PutUint16(b[8:], pageCRCVersion)
	le.PutUint32(b[12:], PageSize)
	le.PutUint64(b[16:], uint64(len(crcs)))
	for i, c := range crcs {
		le.PutUint32(b[pageCRCHeaderSize+4*i:], c)
	}
	return b
}

func unmarshalPageCRCs(b []byte) ([]uint32, error) {
	le := binary.LittleEndian
	switch {
	case len(b) < pageCRCHeaderSize || string(b[:8]) != pageCRCMagic:
		return nil, fmt.Errorf("%w: page checksums: bad header", ErrBadMagic)
	case le.Uint16(b[8:]) != pageCRCVersion:
		return nil, fmt.Errorf("%w: page checksums version %d, this build reads %d", ErrVersion, le.Uint16(b[8:]), pageCRCVersion)
	case le.Uint32(b[12:]) != PageSize:
		return nil, fmt.Errorf("%w: page checksums of %d-byte pages", ErrCorrupt, le.Uint32(b[12:]))
	}
	n := le.Uint64(b[16:])
	if n > maxPageCRCs || uint64(len(b)-pageCRCHeaderSize) != 4*n {
		return nil, fmt.Errorf("%w: page checksums: %d entries in %d bytes", ErrCorrupt, n, len(b))
	}
	crcs := make([]uint32, n)
	for i := range crcs {
		crcs[i] = le.Uint32(b[pageCRCHeaderSize+4*i:])
	}
	return crcs, nil
}

// pageCRCs are the page checksums of one process's Raw blocks, as a
// reader uses them.
type pageCRCs struct {
	crcs  []uint32
	first map[uint64]uint32 // block index -> index of its first page in crcs
}

// hasPageCRCs reports whether block b has page checksums.
func hasPageCRCsFor(b Block) bool {
	return b.Kind == codec.Raw && b.Len > PageSize
}

// newPageCRCs checks crcs against the layout (one per page of each Raw
// block longer than a page, in block order) and indexes them.
func newPageCRCs(lay *layout, crcs []uint32) (*pageCRCs, error) {
	pc := &pageCRCs{crcs: crcs, first: map[uint64]uint32{}}
	var n uint64
	for ri := range lay.ix.Runs {
		r := lay.ix.Runs[ri]
		for i := r.FirstBlock; i < r.FirstBlock+blocksInRange(r.Addr, r.End(), lay.ix.BlockSize); i++ {
			b := lay.block(ri, i)
			if !hasPageCRCsFor(b) {
				continue
			}
			if n+uint64(b.Len/PageSize) > uint64(len(crcs)) {
				return nil, fmt.Errorf("%w: page checksums: %d entries, the Raw blocks have more pages", ErrCorrupt, len(crcs))
			}
			pc.first[b.Index] = uint32(n)
			n += uint64(b.Len / PageSize)
		}
	}
	if n != uint64(len(crcs)) {
		return nil, fmt.Errorf("%w: page checksums: %d entries for %d pages of Raw blocks", ErrCorrupt, len(crcs), n)
	}
	return pc, nil
}

// check checks data, the pages of Raw block b from address at on (page
// aligned, whole pages), against their checksums.
func (pc *pageCRCs) check(b Block, at uint64, data []byte) error {
	first := uint64(pc.first[b.Index]) + (at-b.Addr)/PageSize
	for off := 0; off < len(data); off += PageSize {
		want := pc.crcs[first+uint64(off/PageSize)]
		if got := codec.Checksum(data[off : off+PageSize]); got != want {
			return fmt.Errorf("%w: page at %#x: crc32c %08x, want %08x", codec.ErrChecksum, at+uint64(off), got, want)
		}
	}
	return nil
}

// covers reports whether block i has page checksums (in an incremental
// snapshot, a Raw block of a parent dumped without them has none).
func (pc *pageCRCs) covers(i uint64) bool {
	_, ok := pc.first[i]
	return ok
}
