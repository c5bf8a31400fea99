package codec

import (
	"fmt"
	"testing"
)

// TestShuffleSample compares the encoder, which chooses a block's shuffle
// on a sample, with one that tries both element sizes on every block:
// the same kind wherever the exhaustive one did not shuffle (the sample
// never changes the choice between Raw and LZ4), and a ratio within 1%
// of its ratio overall, for every kind of memory and both modes.
func TestShuffleSample(t *testing.T) {
	kinds := append(append([]dataKind{}, allDataKinds...), weightKinds...)
	for _, mode := range []Mode{ShuffleLZ4, ShuffleHuff} {
		for _, kind := range kinds {
			t.Run(fmt.Sprintf("%s/%s", mode, kind), func(t *testing.T) {
				src := genData(kind, 4<<20, 3)
				var fast Encoder
				slow := Encoder{exhaustive: true}
				var nFast, nSlow, shuffled int
				for off := 0; off < len(src); off += DefaultBlockSize {
					blk := src[off : off+DefaultBlockSize]
					ks, s := slow.Encode(blk, mode)
					nSlow += len(s)
					kf, f := fast.Encode(blk, mode)
					nFast += len(f)
					dst := make([]byte, len(blk))
					if err := DecodeChecked(dst, kf, f, Checksum(blk)); err != nil {
						t.Fatalf("block at %d: %s: %v", off, kf, err)
					}
					if ks != Shuffle && kf != ks {
						t.Fatalf("block at %d: %s, exhaustive %s", off, kf, ks)
					}
					if kf == Shuffle {
						shuffled++
					}
				}
				rf, rs := float64(nFast)/float64(len(src)), float64(nSlow)/float64(len(src))
				t.Logf("ratio %.4f sampled, %.4f exhaustive; %d blocks shuffled", rf, rs, shuffled)
				if rf > rs*1.01 {
					t.Errorf("ratio %.4f with a sample, %.4f trying every block whole", rf, rs)
				}
			})
		}
	}
}

// TestShuffleSampleRawPlanes: the planes a sample finds incompressible
// are stored raw, and a block the sample rejects is not shuffled.
func TestShuffleSampleRawPlanes(t *testing.T) {
	var e Encoder
	bf16 := genData(dataBF16Normal, DefaultBlockSize, 9)
	p := e.planShuffle(bf16, planeLZ4, false)
	if p.elem == 0 {
		t.Fatal("bf16 weights: the sample says not to shuffle")
	}
	// The mantissa bytes (the low byte of each bf16) are noise.
	if p.raw&1 == 0 {
		t.Errorf("bf16 weights, element size %d: raw planes %#b, want plane 0 among them", p.elem, p.raw)
	}
	if p := e.planShuffle(genData(dataRandom, DefaultBlockSize, 9), planeHuff, false); p.elem != 0 {
		t.Errorf("random memory: the sample says to shuffle by %d", p.elem)
	}
	if p := e.planShuffle(genData(dataF32Normal, DefaultBlockSize, 9), planeLZ4, false); p.elem != 0 {
		t.Errorf("float32 weights with LZ4 planes: the sample says to shuffle by %d (only the exponent plane shrinks)", p.elem)
	}
	k, stored := e.Encode(bf16, ShuffleLZ4)
	if k != Shuffle {
		t.Fatalf("bf16 weights stored as %s", k)
	}
	if stored[1] != planeRaw {
		t.Errorf("plane 0 stored with method %d, want raw", stored[1])
	}
}
