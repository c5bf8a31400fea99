package codec

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

// FuzzDecode feeds arbitrary stored bytes, kinds and lengths to Decode,
// DecodeChecked and DecodeBlocks: none may panic or allocate from an
// unchecked length, and bytes handed over must match their CRC.
// The seed corpus is in testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	page := genData(dataRecords, PageSize, 1)
	kind, stored := Encode(nil, page, Compress)
	f.Add(uint8(kind), uint8(1), stored, Checksum(page), int64(0), int32(len(stored)), int32(PageSize))

	f.Fuzz(func(t *testing.T, kind, pages uint8, stored []byte, crc uint32, off int64, storedLen, blockLen int32) {
		dst := make([]byte, int(pages%65)*PageSize)
		if err := Decode(dst, Kind(kind), stored); err != nil && !errors.Is(err, ErrUndecodable) {
			t.Fatalf("Decode: %v is not ErrUndecodable", err)
		}
		err := DecodeChecked(dst, Kind(kind), stored, crc)
		if err == nil && Checksum(dst) != crc {
			t.Fatal("DecodeChecked accepted bytes that do not match the CRC")
		}
		if err != nil && !errors.Is(err, ErrUndecodable) && !errors.Is(err, ErrChecksum) {
			t.Fatalf("DecodeChecked: %v", err)
		}

		blk := Block{Kind: Kind(kind), Off: off, StoredLen: int(storedLen), Len: int(blockLen), CRC: crc}
		err = DecodeBlocks(context.Background(), bytes.NewReader(stored), []Block{blk, blk},
			DecodeOptions{Threads: 2}, func(first int, out [][]byte) error {
				for _, b := range out {
					if Checksum(b) != crc {
						t.Fatal("DecodeBlocks handed over bytes that do not match the CRC")
					}
				}
				return nil
			})
		var be *BlockError
		if err != nil && !errors.As(err, &be) {
			t.Fatalf("DecodeBlocks: %v is not a BlockError", err)
		}
	})
}

// FuzzShuffle decodes arbitrary stored bytes as a Shuffle block (seeded
// with real encodings of weights in both shuffling modes): no panic, no
// error but ErrUndecodable. It then encodes the input, read as memory, in
// both modes and checks that it decodes back.
func FuzzShuffle(f *testing.F) {
	for i, kind := range []dataKind{dataBF16Normal, dataF32Normal} {
		page := genData(kind, PageSize, uint64(i))
		for _, mode := range []Mode{ShuffleLZ4, ShuffleHuff} {
			if k, stored := Encode(nil, page, mode); k == Shuffle {
				f.Add(uint8(1), stored)
			}
		}
	}
	f.Fuzz(func(t *testing.T, pages uint8, stored []byte) {
		dst := make([]byte, int(pages%17)*PageSize)
		if err := Decode(dst, Shuffle, stored); err != nil && !errors.Is(err, ErrUndecodable) {
			t.Fatalf("Decode: %v is not ErrUndecodable", err)
		}
		src := make([]byte, (len(stored)+PageSize-1)/PageSize*PageSize)
		copy(src, stored)
		if len(src) == 0 || len(src) > MaxBlockSize {
			return
		}
		for _, mode := range []Mode{ShuffleLZ4, ShuffleHuff} {
			k, enc := Encode(nil, src, mode)
			got := make([]byte, len(src))
			if err := DecodeChecked(got, k, enc, Checksum(src)); err != nil {
				t.Fatalf("%s: %s block does not decode back: %v", mode, k, err)
			}
		}
	})
}
