package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/klauspost/compress/huff0"
	"github.com/pierrec/lz4/v4"
)

var weightKinds = []dataKind{dataBF16Normal, dataF32Normal}

// naivePlanes is the definition of the shuffle: plane j holds byte j of
// every e-byte element.
func naivePlanes(src []byte, e int) [][]byte {
	planes := make([][]byte, e)
	for j := range planes {
		for i := j; i < len(src); i += e {
			planes[j] = append(planes[j], src[i])
		}
	}
	return planes
}

func TestShuffleMatchesDefinition(t *testing.T) {
	src := genData(dataRandom, 2*PageSize, 7)
	for _, e := range []int{2, 4} {
		// Lengths around the 8-element steps of the word loops.
		for _, n := range []int{0, e, 7 * e, 8 * e, 9 * e, 17 * e, 63 * e, PageSize, 2 * PageSize} {
			t.Run(fmt.Sprintf("e=%d/n=%d", e, n), func(t *testing.T) {
				in := src[:n]
				got := make([]byte, n)
				shuffle(got, in, e)
				want := bytes.Join(naivePlanes(in, e), nil)
				if !bytes.Equal(got, want) {
					t.Fatalf("shuffle differs from the definition at byte %d", firstDiff(got, want))
				}
				back := make([]byte, n)
				unshuffle(back, naivePlanes(in, e))
				if !bytes.Equal(back, in) {
					t.Fatalf("unshuffle of the definition's planes differs at byte %d", firstDiff(back, in))
				}
				// The portable version, which unshuffle uses for what the
				// vector version leaves.
				clear(back)
				unshuffleWords(back, naivePlanes(in, e))
				if !bytes.Equal(back, in) {
					t.Fatalf("unshuffleWords differs at byte %d", firstDiff(back, in))
				}
			})
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// handmade builds a Shuffle block from the definition's planes, each
// stored with the given method, without the encoder.
func handmade(t *testing.T, src []byte, e int, methods []int) []byte {
	t.Helper()
	planes := naivePlanes(src, e)
	out := []byte{byte(e)}
	var body []byte
	for j, p := range planes {
		var s []byte
		switch methods[j] {
		case planeRaw:
			s = p
		case planeLZ4:
			buf := make([]byte, lz4.CompressBlockBound(len(p)))
			n, err := lz4.CompressBlock(p, buf, nil)
			if err != nil || n == 0 {
				t.Fatalf("lz4 plane %d: %d, %v", j, n, err)
			}
			s = buf[:n]
		case planeHuff:
			for off := 0; off < len(p); off += huffChunk {
				var hs huff0.Scratch
				c, _, err := huff0.Compress4X(p[off:min(off+huffChunk, len(p))], &hs)
				if err != nil {
					t.Fatalf("huff0 plane %d: %v", j, err)
				}
				s = binary.LittleEndian.AppendUint32(s, uint32(len(c)))
				s = append(s, c...)
			}
		}
		out = append(out, byte(methods[j]))
		out = binary.LittleEndian.AppendUint32(out, uint32(len(s)))
		body = append(body, s...)
	}
	return append(out, body...)
}

// TestShuffleDecodeHandmade decodes blocks laid out by hand from the
// definition of the format, so that a shuffle and unshuffle that agree with
// each other but not with the format fail.
func TestShuffleDecodeHandmade(t *testing.T) {
	type plan struct {
		e       int
		methods []int
	}
	// huff0 codes only planes that shrink: the exponent planes (1 and 3
	// of bf16, 3 of float32); LZ4 codes any plane.
	for kind, plans := range map[dataKind][]plan{
		dataBF16Normal: {
			{2, []int{planeRaw, planeRaw}},
			{2, []int{planeRaw, planeLZ4}},
			{2, []int{planeLZ4, planeHuff}},
			{4, []int{planeRaw, planeHuff, planeLZ4, planeHuff}},
		},
		dataF32Normal: {
			{2, []int{planeRaw, planeLZ4}},
			{4, []int{planeRaw, planeLZ4, planeRaw, planeHuff}},
			{4, []int{planeLZ4, planeRaw, planeLZ4, planeLZ4}},
		},
	} {
		// 1 MiB: planes of several huff0 chunks.
		src := genData(kind, 1<<20, 3)
		for _, tc := range plans {
			t.Run(fmt.Sprintf("%s/e=%d/%v", kind, tc.e, tc.methods), func(t *testing.T) {
				stored := handmade(t, src, tc.e, tc.methods)
				dst := make([]byte, len(src))
				if err := DecodeChecked(dst, Shuffle, stored, Checksum(src)); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestShuffleEncode checks what each mode makes of each kind of memory:
// the kind chosen, that it decodes back, and that Shuffle is kept only
// where it beats LZ4 and the 12.5% rule.
func TestShuffleEncode(t *testing.T) {
	kinds := append(append([]dataKind{}, allDataKinds...), weightKinds...)
	for _, mode := range []Mode{ShuffleLZ4, ShuffleHuff} {
		for _, kind := range kinds {
			t.Run(fmt.Sprintf("%s/%s", mode, kind), func(t *testing.T) {
				src := genData(kind, 256<<10, 11)
				lk, lz := Encode(nil, src, Compress)
				k, stored := Encode(nil, src, mode)
				dst := make([]byte, len(src))
				if err := DecodeChecked(dst, k, stored, Checksum(src)); err != nil {
					t.Fatalf("%s block: %v", k, err)
				}
				switch {
				case kind == dataZero:
					if k != Zero {
						t.Fatalf("zero block stored as %s", k)
					}
				case k == Shuffle:
					if !keepLZ4(len(stored), len(src)) || (lk == LZ4 && len(stored) >= len(lz)) {
						t.Fatalf("shuffle block of %d bytes kept; lz4 %s of %d", len(stored), lk, len(lz))
					}
				case k != lk:
					t.Fatalf("stored as %s, plain rule gives %s", k, lk)
				}
				// bf16 weights must shuffle in both modes, float32 weights
				// with huff0 planes (with LZ4 planes only their exponent
				// plane shrinks, less than 12.5% of the block); float32
				// shuffles by 4 bytes. Random memory must not shuffle.
				if kind == dataBF16Normal || kind == dataF32Normal && mode == ShuffleHuff {
					if k != Shuffle {
						t.Fatalf("weights stored as %s", k)
					}
				}
				if kind == dataF32Normal && k == Shuffle && stored[0] != 4 {
					t.Fatalf("float32 weights shuffled with element size %d", stored[0])
				}
				if kind == dataRandom && k != Raw {
					t.Fatalf("random memory stored as %s", k)
				}
				t.Logf("%s: %s ratio %.3f (lz4 rule: %s %.3f)", kind, k, float64(len(stored))/float64(len(src)),
					lk, float64(max(len(lz), 1))/float64(len(src)))
			})
		}
	}
}

// TestShuffleRatio holds the ratio of normal-distributed bf16 weights to
// the targets: 0.86 with LZ4 planes, 0.72 with huff0 planes.
func TestShuffleRatio(t *testing.T) {
	src := genData(dataBF16Normal, 4<<20, 5)
	for _, tc := range []struct {
		mode Mode
		max  float64
	}{{ShuffleLZ4, 0.86}, {ShuffleHuff, 0.72}} {
		stored := 0
		for off := 0; off < len(src); off += DefaultBlockSize {
			_, s := Encode(nil, src[off:off+DefaultBlockSize], tc.mode)
			stored += len(s)
		}
		r := float64(stored) / float64(len(src))
		t.Logf("%s: bf16 weights ratio %.3f", tc.mode, r)
		if r > tc.max {
			t.Errorf("%s: ratio %.3f, want at most %.2f", tc.mode, r, tc.max)
		}
	}
}

func TestShuffleCorrupt(t *testing.T) {
	src := genData(dataBF16Normal, PageSize, 1)
	good := handmade(t, src, 2, []int{planeRaw, planeLZ4})
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for name, stored := range map[string][]byte{
		"empty":          {},
		"element size 3": mut(func(b []byte) []byte { b[0] = 3; return b }),
		"short header":   good[:5],
		"plane too long": mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[2:], 1<<30); return b }),
		"raw plane short": mut(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[2:], PageSize/2-1)
			return b
		}),
		"unknown method": mut(func(b []byte) []byte { b[6] = 9; return b }),
		"trailing bytes": append(bytes.Clone(good), 0),
		"truncated":      good[:len(good)-1],
	} {
		t.Run(name, func(t *testing.T) {
			err := Decode(make([]byte, len(src)), Shuffle, stored)
			if !errors.Is(err, ErrUndecodable) {
				t.Fatalf("Decode: %v, want ErrUndecodable", err)
			}
		})
	}
	// huff0 planes: a chunk length past the end, a chunk too short.
	hgood := handmade(t, src, 2, []int{planeRaw, planeHuff})
	at := shuffleHeader(2) + PageSize/2 // the first chunk's length
	for name, f := range map[string]func(b []byte){
		"chunk too long": func(b []byte) { binary.LittleEndian.PutUint32(b[at:], 1<<20) },
		"chunk short":    func(b []byte) { binary.LittleEndian.PutUint32(b[at:], binary.LittleEndian.Uint32(b[at:])-1) },
		"table garbage":  func(b []byte) { b[at+4] ^= 0xff },
	} {
		b := bytes.Clone(hgood)
		f(b)
		if err := Decode(make([]byte, len(src)), Shuffle, b); !errors.Is(err, ErrUndecodable) {
			t.Errorf("huff0 %s: %v, want ErrUndecodable", name, err)
		}
	}
	if err := Decode(make([]byte, len(src)), Shuffle, hgood); err != nil {
		t.Fatalf("huff0 plane: %v", err)
	}
	// A plane that decodes to bytes, but the wrong ones, fails the CRC.
	bad := mut(func(b []byte) []byte { b[shuffleHeader(2)] ^= 1; return b })
	if err := DecodeChecked(make([]byte, len(src)), Shuffle, bad, Checksum(src)); !errors.Is(err, ErrChecksum) {
		t.Fatalf("flipped raw plane byte: %v, want ErrChecksum", err)
	}
}

// TestShufflePipeline runs mixed memory with weights through the Pipeline
// and DecodeBlocks on several threads, in both shuffling modes.
func TestShufflePipeline(t *testing.T) {
	data := append(genData(dataMixed, 4<<20, 2), genData(dataBF16Normal, 4<<20, 3)...)
	data = append(data, genData(dataF32Normal, 2<<20, 4)...)
	for _, mode := range []Mode{ShuffleLZ4, ShuffleHuff} {
		t.Run(mode.String(), func(t *testing.T) {
			e := encodeAll(t, data, 256<<10, 2, mode)
			if e.kinds[Shuffle] == 0 || e.kinds[Raw] == 0 || e.kinds[Zero] == 0 {
				t.Fatalf("kinds %v: want zero, raw and shuffle blocks", e.kinds)
			}
			for _, threads := range []int{1, 2} {
				got, err := decodeAll(t, e.pages, e.blocks, DecodeOptions{Threads: threads, BatchBytes: 1 << 20})
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, data) {
					t.Fatalf("threads %d: decoded memory differs at byte %d", threads, firstDiff(got, data))
				}
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	for _, m := range Modes {
		got, err := ParseMode(m.String())
		if err != nil || got != m {
			t.Fatalf("ParseMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	if _, err := ParseMode("gzip"); err == nil {
		t.Fatal("ParseMode(gzip) accepted")
	}
}
