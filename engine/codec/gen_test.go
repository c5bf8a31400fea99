package codec

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// Synthetic process memory for tests and benchmarks. Every generator is
// deterministic for a given seed and fills whole pages.

type dataKind string

const (
	dataZero    dataKind = "zero"
	dataRandom  dataKind = "random"
	dataBF16    dataKind = "bf16"
	dataRecords dataKind = "records"
	dataMixed   dataKind = "mixed" // 1/4 zero, 1/4 random, 1/2 bf16, in 1 MiB stripes
	// Weights as trained: values of N(0, 0.02) as bf16 (round to nearest
	// even) and as float32.
	dataBF16Normal dataKind = "bf16-normal"
	dataF32Normal  dataKind = "f32-normal"
)

var allDataKinds = []dataKind{dataZero, dataRandom, dataBF16, dataRecords, dataMixed}

func genData(kind dataKind, n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	switch kind {
	case dataZero:
	case dataRandom:
		fillRandom(r, b)
	case dataBF16:
		fillBF16(r, b)
	case dataRecords:
		fillRecords(r, b)
	case dataMixed:
		const stripe = 1 << 20
		for off := 0; off < n; off += stripe {
			s := b[off:min(off+stripe, n)]
			switch (off / stripe) % 4 {
			case 0: // zero
			case 1:
				fillRandom(r, s)
			default:
				fillBF16(r, s)
			}
		}
	case dataBF16Normal:
		for i := 0; i+2 <= n; i += 2 {
			binary.LittleEndian.PutUint16(b[i:], bf16(float32(r.NormFloat64()*0.02)))
		}
	case dataF32Normal:
		for i := 0; i+4 <= n; i += 4 {
			binary.LittleEndian.PutUint32(b[i:], math.Float32bits(float32(r.NormFloat64()*0.02)))
		}
	default:
		panic("unknown data kind " + kind)
	}
	return b
}

// bf16 rounds f to bfloat16 (the high half of its float32 bits), to the
// nearest, ties to even.
func bf16(f float32) uint16 {
	u := math.Float32bits(f)
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

func fillRandom(r *rand.Rand, b []byte) {
	for len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, r.Uint64())
		b = b[8:]
	}
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// fillBF16 writes bf16-like weights: 16-bit little-endian values whose high
// byte (sign and exponent) comes from a narrow range and whose low byte
// (mantissa) is random. LZ4 cannot shrink these by 12.5%.
func fillBF16(r *rand.Rand, b []byte) {
	for len(b) >= 8 {
		v := r.Uint64()
		for i := 0; i < 8; i += 2 {
			hi := byte(0x3c + (v>>(8*i+8))%4) // exponents around 1.0
			if v>>(8*i+15)&1 == 1 {
				hi |= 0x80 // sign
			}
			b[i] = byte(v >> (8 * i))
			b[i+1] = hi
		}
		b = b[8:]
	}
}

var recordWords = []string{"user", "session", "GET /api/v1/items", "200 OK", "name",
	"email@example.com", "id", "token", "cache", "model.layers.0"}

// fillRecords writes heap-like 64-byte records: two pointers into a heap,
// a small length, a type tag, part of a string from a small vocabulary and
// a counter, with zero padding.
func fillRecords(r *rand.Rand, b []byte) {
	const heap = 0x000000c000000000
	var rec [64]byte
	for i := 0; len(b) > 0; i++ {
		clear(rec[:])
		binary.LittleEndian.PutUint64(rec[0:], heap+uint64(i)*64+uint64(r.IntN(4))*16)
		binary.LittleEndian.PutUint64(rec[8:], heap+0x100000+uint64(r.IntN(1<<16))*8)
		w := recordWords[r.IntN(len(recordWords))]
		binary.LittleEndian.PutUint64(rec[16:], uint64(len(w)))
		binary.LittleEndian.PutUint32(rec[24:], uint32(1+r.IntN(4)))
		copy(rec[32:48], w)
		binary.LittleEndian.PutUint64(rec[48:], uint64(i))
		binary.LittleEndian.PutUint32(rec[56:], uint32(r.IntN(1000)))
		b = b[copy(b, rec[:]):]
	}
}

// encoded is a pages file and its block index, as a dump would write them.
type encoded struct {
	pages  []byte
	blocks []Block
	kinds  [NumKinds]int
}

// encodeAll runs data through a Pipeline in blocks of bs bytes and lays the
// stored bytes out like the pages file: back to back, Raw payloads on a page
// boundary.
func encodeAll(tb testing.TB, data []byte, bs, workers int, mode Mode) *encoded {
	tb.Helper()
	e := encoded{pages: make([]byte, 0, len(data)+len(data)/8)}
	emit := func(b *Encoded) error {
		off := len(e.pages)
		if b.Kind == Raw && off%PageSize != 0 {
			off += PageSize - off%PageSize
			e.pages = append(e.pages, make([]byte, off-len(e.pages))...)
		}
		if b.Kind == Zero {
			off = 0
		}
		e.pages = append(e.pages, b.Stored...)
		e.blocks = append(e.blocks, Block{Kind: b.Kind, Off: int64(off), StoredLen: len(b.Stored),
			Len: len(b.Src), CRC: b.CRC})
		e.kinds[b.Kind]++
		return nil
	}
	p := NewPipeline(context.Background(), PipelineOptions{Workers: workers, Mode: mode}, emit)
	for off := 0; off < len(data); off += bs {
		if err := p.Submit(data[off:min(off+bs, len(data))], off); err != nil {
			tb.Fatalf("submit: %v", err)
		}
	}
	if err := p.Close(); err != nil {
		tb.Fatalf("close: %v", err)
	}
	return &e
}

// decodeAll decodes every block and checks that fn sees batches in order.
func decodeAll(tb testing.TB, src []byte, blocks []Block, opts DecodeOptions) ([]byte, error) {
	tb.Helper()
	total := 0
	for _, b := range blocks {
		total += max(b.Len, 0)
	}
	out := make([]byte, 0, min(total, 1<<30))
	next := 0
	err := DecodeBlocks(context.Background(), bytes.NewReader(src), blocks, opts,
		func(first int, bs [][]byte) error {
			if first != next {
				tb.Errorf("batch starts at block %d, want %d", first, next)
			}
			if opts.BatchBytes > 0 && len(bs) > 1 {
				n := 0
				for _, b := range bs {
					n += len(b)
				}
				if n > opts.BatchBytes {
					tb.Errorf("batch of %d bytes, more than %d", n, opts.BatchBytes)
				}
			}
			for _, b := range bs {
				out = append(out, b...)
			}
			next += len(bs)
			return nil
		})
	return out, err
}
