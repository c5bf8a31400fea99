package codec

import (
	"math/rand/v2"
	"testing"
)

// TestPageChecksums: the page checksums are each page's CRC32C, and the
// combined one is the CRC32C of the whole, for every length from one page
// to 64 and for zeros, random bytes and a single set bit.
func TestPageChecksums(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, fill := range []string{"zero", "random", "onebit"} {
		for pages := 1; pages <= 64; pages++ {
			b := make([]byte, pages*PageSize)
			switch fill {
			case "random":
				for i := range b {
					b[i] = byte(rng.Uint32())
				}
			case "onebit":
				b[rng.IntN(len(b))] = 1 << rng.IntN(8)
			}
			got, crc := PageChecksums(nil, b)
			if want := Checksum(b); crc != want {
				t.Fatalf("%s, %d pages: combined crc %08x, want %08x", fill, pages, crc, want)
			}
			if len(got) != pages {
				t.Fatalf("%s, %d pages: %d checksums", fill, pages, len(got))
			}
			for i, c := range got {
				if want := Checksum(b[i*PageSize : (i+1)*PageSize]); c != want {
					t.Fatalf("%s, page %d of %d: %08x, want %08x", fill, i, pages, c, want)
				}
			}
		}
	}
}

func BenchmarkPageChecksums(b *testing.B) {
	buf := make([]byte, 256<<10)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	dst := make([]uint32, 0, 64)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		dst, _ = PageChecksums(dst[:0], buf)
	}
}

func BenchmarkChecksum256K(b *testing.B) {
	buf := make([]byte, 256<<10)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		Checksum(buf)
	}
}
