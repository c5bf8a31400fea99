package image

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/lazyfs/lazyfs/engine/codec"
)

// Format constants of the page index.
const (
	indexMagic      = "LZFSPIDX"
	indexVersion    = 1
	indexHeaderSize = 64
	runRecordSize   = 24
	blockRecordSize = 8

	// PageSize is the page size of every snapshot.
	PageSize = codec.PageSize
	// MinBlockSize and MaxBlockSize bound the block size.
	MinBlockSize = PageSize
	MaxBlockSize = codec.MaxBlockSize

	// maxBlocks and maxRuns are hard limits on the counts read from an
	// index, before any allocation: 2^32 blocks of 4 KiB is 16 TiB.
	maxBlocks = 1 << 32
	maxRuns   = 1 << 28
	// maxAddr is the end of the x86-64 user address space (57-bit
	// addressing included).
	maxAddr = 1 << 57

	rawAlign = 4096
)

// Run is a range of dumped pages.
type Run struct {
	Addr       uint64 // page aligned
	Pages      uint64
	FirstBlock uint64 // index of the run's first block
}

// End returns the address after the run.
func (r Run) End() uint64 { return r.Addr + r.Pages*PageSize }

// BlockRecord is the stored description of one block.
type BlockRecord struct {
	Kind      codec.Kind
	StoredLen uint32 // 0 for Zero; the decoded length for Raw
	CRC       uint32 // CRC32C of the decoded bytes
}

// Index is the decoded page index of one process.
type Index struct {
	BlockSize uint64
	PagesSize uint64 // size of the pages file
	Runs      []Run
	Blocks    []BlockRecord
}

// blocksInRange returns how many blocks of size bs cover [addr, end).
func blocksInRange(addr, end, bs uint64) uint64 {
	if end <= addr {
		return 0
	}
	first := addr / bs
	last := (end - 1) / bs
	return last - first + 1
}

// validBlockSize reports whether bs is a power of two in [MinBlockSize, MaxBlockSize].
func validBlockSize(bs uint64) bool {
	return bs >= MinBlockSize && bs <= MaxBlockSize && bits.OnesCount64(bs) == 1
}

// MarshalBinary encodes the index. It does not validate; Writer builds
// valid indexes.
func (ix *Index) MarshalBinary() ([]byte, error) {
	n := indexHeaderSize + len(ix.Runs)*runRecordSize + len(ix.Blocks)*blockRecordSize
	b := make([]byte, n)
	copy(b, indexMagic)
	le := binary.LittleEndian
	le.PutUint16(b[8:], indexVersion)
	le.PutUint16(b[10:], indexHeaderSize)
	le.PutUint32(b[12:], PageSize)
	le.PutUint32(b[16:], uint32(ix.BlockSize))
	le.PutUint64(b[24:], uint64(len(ix.Runs)))
	le.PutUint64(b[32:], uint64(len(ix.Blocks)))
	le.PutUint64(b[40:], ix.PagesSize)
	p := b[indexHeaderSize:]
	for _, r := range ix.Runs {
		le.PutUint64(p[0:], r.Addr)
		le.PutUint64(p[8:], r.Pages)
		le.PutUint64(p[16:], r.FirstBlock)
		p = p[runRecordSize:]
	}
	for _, k := range ix.Blocks {
		if k.StoredLen >= 1<<24 {
			return nil, fmt.Errorf("block stored length %d does not fit the index", k.StoredLen)
		}
		le.PutUint32(p[0:], uint32(k.Kind)|k.StoredLen<<8)
		le.PutUint32(p[4:], k.CRC)
		p = p[blockRecordSize:]
	}
	le.PutUint32(b[48:], codec.Checksum(b[indexHeaderSize:]))
	le.PutUint32(b[60:], codec.Checksum(b[:60]))
	return b, nil
}

// UnmarshalIndex decodes and validates an index. pagesSize is the actual
// size of the pages file, checked against the index; pass -1 to skip that
// check. Every count is bounded by len(b) before allocation. The checks
// run in the order of the bytes (header, runs, block records, totals) in
// one function, so that each bound is visibly in place before its use.
func UnmarshalIndex(b []byte, pagesSize int64) (*Index, error) {
	if len(b) < indexHeaderSize {
		if len(b) >= len(indexMagic) && string(b[:len(indexMagic)]) != indexMagic {
			return nil, ErrBadMagic
		}
		return nil, fmt.Errorf("%w: index of %d bytes, header needs %d", ErrTruncated, len(b), indexHeaderSize)
	}
	if string(b[:8]) != indexMagic {
		return nil, ErrBadMagic
	}
	le := binary.LittleEndian
	if v := le.Uint16(b[8:]); v != indexVersion {
		return nil, fmt.Errorf("%w: index version %d, this build reads %d", ErrVersion, v, indexVersion)
	}
	if got, want := codec.Checksum(b[:60]), le.Uint32(b[60:]); got != want {
		return nil, fmt.Errorf("index header: %w (crc32c %08x, want %08x)", ErrHeaderChecksum, got, want)
	}
	if hs := le.Uint16(b[10:]); hs != indexHeaderSize {
		return nil, fmt.Errorf("%w: index header size %d", ErrCorrupt, hs)
	}
	if ps := le.Uint32(b[12:]); ps != PageSize {
		return nil, fmt.Errorf("%w: page size %d, this build supports %d", ErrCorrupt, ps, PageSize)
	}
	ix := &Index{BlockSize: uint64(le.Uint32(b[16:])), PagesSize: le.Uint64(b[40:])}
	if !validBlockSize(ix.BlockSize) {
		return nil, fmt.Errorf("%w: block size %d", ErrCorrupt, ix.BlockSize)
	}
	nruns, nblocks := le.Uint64(b[24:]), le.Uint64(b[32:])
	if nruns > maxRuns || nblocks > maxBlocks {
		return nil, fmt.Errorf("%w: %d runs, %d blocks: past the format's limits", ErrCorrupt, nruns, nblocks)
	}
	body := uint64(len(b) - indexHeaderSize)
	if need := nruns*runRecordSize + nblocks*blockRecordSize; need != body {
		if need > body {
			return nil, fmt.Errorf("%w: index holds %d bytes of tables, header says %d", ErrTruncated, body, need)
		}
		return nil, fmt.Errorf("%w: %d bytes after the index tables", ErrCorrupt, body-need)
	}
	if got, want := codec.Checksum(b[indexHeaderSize:]), le.Uint32(b[48:]); got != want {
		return nil, fmt.Errorf("index tables: %w (crc32c %08x, want %08x)", ErrHeaderChecksum, got, want)
	}
	if pagesSize >= 0 && uint64(pagesSize) != ix.PagesSize {
		if uint64(pagesSize) < ix.PagesSize {
			return nil, fmt.Errorf("%w: pages file of %d bytes, index says %d", ErrTruncated, pagesSize, ix.PagesSize)
		}
		return nil, fmt.Errorf("%w: pages file of %d bytes, index says %d", ErrCorrupt, pagesSize, ix.PagesSize)
	}

	runs, p, err := unmarshalRuns(b[indexHeaderSize:], nruns, nblocks, ix.BlockSize)
	if err != nil {
		return nil, err
	}
	ix.Runs = runs
	ix.Blocks = make([]BlockRecord, nblocks)
	for i := range ix.Blocks {
		w := le.Uint32(p[0:])
		ix.Blocks[i] = BlockRecord{Kind: codec.Kind(w & 0xff), StoredLen: w >> 8, CRC: le.Uint32(p[4:])}
		p = p[blockRecordSize:]
	}
	return ix, nil
}

// unmarshalRuns decodes and checks the run table at the start of p (runs
// in address order, page aligned, inside the address space, each
// starting at the block after the previous run's, covering exactly
// nblocks blocks of blockSize) and returns the runs and the rest of p.
func unmarshalRuns(p []byte, nruns, nblocks, blockSize uint64) ([]Run, []byte, error) {
	le := binary.LittleEndian
	runs := make([]Run, nruns)
	var next, prevEnd uint64
	for i := range runs {
		r := Run{Addr: le.Uint64(p[0:]), Pages: le.Uint64(p[8:]), FirstBlock: le.Uint64(p[16:])}
		p = p[runRecordSize:]
		switch {
		case r.Addr%PageSize != 0 || r.Pages == 0:
			return nil, nil, fmt.Errorf("%w: run %d at %#x of %d pages", ErrCorrupt, i, r.Addr, r.Pages)
		case r.Addr >= maxAddr || r.Pages > (maxAddr-r.Addr)/PageSize:
			return nil, nil, fmt.Errorf("%w: run %d at %#x of %d pages passes the address space", ErrCorrupt, i, r.Addr, r.Pages)
		case i > 0 && r.Addr < prevEnd:
			return nil, nil, fmt.Errorf("%w: run %d at %#x overlaps the previous run", ErrCorrupt, i, r.Addr)
		case r.FirstBlock != next:
			return nil, nil, fmt.Errorf("%w: run %d starts at block %d, want %d", ErrCorrupt, i, r.FirstBlock, next)
		}
		next += blocksInRange(r.Addr, r.End(), blockSize)
		if next > nblocks {
			return nil, nil, fmt.Errorf("%w: runs need more than the %d blocks stored", ErrCorrupt, nblocks)
		}
		prevEnd = r.End()
		runs[i] = r
	}
	if next != nblocks {
		return nil, nil, fmt.Errorf("%w: runs cover %d blocks, index holds %d", ErrCorrupt, next, nblocks)
	}
	return runs, p, nil
}
