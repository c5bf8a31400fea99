package codec

import (
	"bytes"
	"errors"
	"slices"
	"testing"
)

// TestDecodeAuthenticated: with DecodeOptions.Authenticated (a source that
// has authenticated every stored byte, a sealed snapshot's payloads) the
// blocks decode as without it but their CRC32C is not checked: every CRC
// made wrong in the block list, the bytes still come out right; without
// the option the first is refused. An undecodable block is still refused.
func TestDecodeAuthenticated(t *testing.T) {
	const bs = 64 << 10
	data, e := mixedImage(t, bs)
	wrong := slices.Clone(e.blocks)
	first := -1
	for i := range wrong {
		if wrong[i].Kind != Zero {
			wrong[i].CRC ^= 0x5a5a5a5a
			if first < 0 {
				first = i
			}
		}
	}
	if e.kinds[Raw] == 0 || e.kinds[LZ4] == 0 {
		t.Fatalf("want Raw and LZ4 blocks: %v", e.kinds)
	}
	for _, threads := range []int{1, 2} {
		src := bytes.NewReader(e.pages)
		n, err := checkPrefix(t, src, wrong, data, DecodeOptions{Threads: threads, BatchBytes: 4 * bs, Authenticated: true})
		if err != nil || n != len(wrong) {
			t.Fatalf("threads %d, authenticated: %d of %d blocks, %v", threads, n, len(wrong), err)
		}
		n, err = checkPrefix(t, src, wrong, data, DecodeOptions{Threads: threads, BatchBytes: 4 * bs})
		var be *BlockError
		if !errors.As(err, &be) || be.Index != first || !errors.Is(err, ErrChecksum) || n != first {
			t.Fatalf("threads %d, not authenticated: %d blocks, %v; want a checksum error at block %d", threads, n, err, first)
		}
	}
	// An LZ4 block that does not decode is refused all the same.
	for i, blk := range e.blocks {
		if blk.Kind != LZ4 {
			continue
		}
		pages := bytes.Clone(e.pages)
		clear(pages[blk.Off : blk.Off+int64(blk.StoredLen)])
		n, err := checkPrefix(t, bytes.NewReader(pages), e.blocks, data, DecodeOptions{BatchBytes: 4 * bs, Authenticated: true})
		var be *BlockError
		if !errors.As(err, &be) || be.Index != i || !errors.Is(err, ErrUndecodable) || n != i {
			t.Fatalf("zeroed LZ4 block %d: %d blocks, %v; want it refused as undecodable", i, n, err)
		}
		break
	}
}
