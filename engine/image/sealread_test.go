package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image/seal"
)

// authRanges is memory for the authenticated readers' tests: 64 KiB
// blocks, Raw (random) then LZ4 (records) then Raw again, several MiB.
func authRanges() []memRange {
	b := make([]byte, 6<<20)
	synth("random", b[:2<<20], 3)
	synth("records", b[2<<20:4<<20], 4)
	synth("random", b[4<<20:], 5)
	return []memRange{{addr: 0x7f0000000000, data: b}}
}

// authSnapshots writes authRanges in clear, sealed (Raw blocks in
// windows), signed, and sealed with every block whole (as before sealed
// windows), and returns the directories and the keyring of each (nil in
// clear).
func authSnapshots(t *testing.T) (dirs [4]string, keys [4]*seal.Keyring) {
	t.Helper()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	ageKey := filepath.Join(tmp, "key.txt")
	os.WriteFile(ageKey, []byte(id.String()+"\n"), 0o600)
	so, err := sealOptions([]string{id.Recipient().String()})
	if err != nil {
		t.Fatal(err)
	}
	signKey, pub := signingKey(t)
	priv, err := seal.ParseSigner(signKey)
	if err != nil {
		t.Fatal(err)
	}
	whole := *so
	whole.whole = true
	opts := [4]Options{{}, {Seal: so}, {Sign: priv}, {Seal: &whole}}
	for i := range opts {
		opts[i].BlockSize, opts[i].Mode = 64<<10, codec.Compress
		dirs[i] = filepath.Join(tmp, fmt.Sprintf("snap%d", i))
		writeSnapshot(t, dirs[i], 42, authRanges(), opts[i])
	}
	keys[1], keys[2], keys[3] = keyring(t, ageKey), keyring(t, pub), keyring(t, ageKey)
	return dirs, keys
}

var authNames = [4]string{"clear", "sealed", "signed", "sealed whole"}

func openAuth(t *testing.T, dir string, k *seal.Keyring) *Reader {
	t.Helper()
	s, err := OpenWith(dir, OpenOptions{Keys: k})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	r, err := s.OpenPages(42, ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// TestAuthenticatedReads: the readers of a sealed or signed snapshot, which
// do not check a block's CRC32C once it is authenticated, read back the
// memory dumped, through every path: cached, uncached (one block, several,
// several MiB), a block's payload alone, reads
// that end just after a block or past the end of the pages file.
func TestAuthenticatedReads(t *testing.T) {
	dirs, keys := authSnapshots(t)
	ranges := authRanges()
	lo := ranges[0].addr
	hi := lo + uint64(len(ranges[0].data))
	want := expected(ranges, lo, hi)
	for v := range dirs {
		t.Run(authNames[v], func(t *testing.T) {
			r := openAuth(t, dirs[v], keys[v])
			if got := r.Authenticated(); got != (v > 0) {
				t.Fatalf("Authenticated() = %v", got)
			}
			got := make([]byte, hi-lo)
			if _, err := r.ReadAt(got, int64(lo)); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("cached read differs (%v)", err)
			}
			clear(got)
			if _, err := r.Uncached().ReadAt(got, int64(lo)); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("uncached read differs (%v)", err)
			}
			var raw, lz4 int
			for b := range r.Blocks() {
				p := make([]byte, b.Len)
				if _, err := r.Uncached().ReadAt(p, int64(b.Addr)); err != nil || !bytes.Equal(p, want[b.Addr-lo:b.End()-lo]) {
					t.Fatalf("block %d (%v) read alone differs (%v)", b.Index, b.Kind, err)
				}
				switch b.Kind {
				case codec.Raw:
					raw++
					// Its payload alone, and with a few bytes after it.
					for _, extra := range []int{0, 1, 15, 16, 17} {
						q := make([]byte, int(b.StoredLen)+extra)
						n, err := r.Payloads().ReadAt(q, int64(b.Off))
						if (err != nil && !errors.Is(err, io.EOF)) || n < int(b.StoredLen) || !bytes.Equal(q[:b.StoredLen], want[b.Addr-lo:b.End()-lo]) {
							t.Fatalf("payload of block %d and %d bytes: %d, %v, or it differs", b.Index, extra, n, err)
						}
					}
				case codec.LZ4:
					lz4++
				}
			}
			if raw < 10 || lz4 < 10 {
				t.Fatalf("%d Raw and %d LZ4 blocks, want both", raw, lz4)
			}
			// The whole pages file and beyond: io.EOF after the last
			// block, decrypted.
			size := r.Stats().FileSize
			all := make([]byte, size+5000)
			n, err := r.Payloads().ReadAt(all, 0)
			if uint64(n) != size || !errors.Is(err, io.EOF) {
				t.Fatalf("read of the pages file and more: %d bytes, %v; want %d, EOF", n, err, size)
			}
			var last Block
			for b := range r.Blocks() {
				last = b
			}
			if last.Kind != codec.Raw || !bytes.Equal(all[last.Off:last.Off+uint64(last.StoredLen)], want[last.Addr-lo:last.End()-lo]) {
				t.Fatalf("last block (%v) read past the end of the file differs", last.Kind)
			}
			if err := r.Stream(context.Background(), lo, hi, false, func(c []Chunk) error {
				for _, x := range c {
					if !bytes.Equal(x.Data, want[x.Addr-lo:x.Addr-lo+uint64(len(x.Data))]) {
						return fmt.Errorf("chunk at %#x differs", x.Addr)
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if err := r.Verify(context.Background(), nil); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAuthenticatedTamper: with no CRC32C checked after authentication, a
// bit flipped in a Raw or an LZ4 block of a sealed or signed snapshot, or
// a block copied over another, is still refused by every reader (cached,
// uncached alone and in a multi-MiB read, the
// payloads as the restore's fill decodes them, Stream), naming the pages
// file and the block.
func TestAuthenticatedTamper(t *testing.T) {
	dirs, keys := authSnapshots(t)
	for v := 1; v < len(dirs); v++ {
		r0 := openAuth(t, dirs[v], keys[v])
		pages := filepath.Base(r0.Name())
		var raws, lz4s []Block
		var all []Block
		for b := range r0.Blocks() {
			all = append(all, b)
			switch b.Kind {
			case codec.Raw:
				raws = append(raws, b)
			case codec.LZ4:
				lz4s = append(lz4s, b)
			}
		}
		rawA, rawB := raws[len(raws)/4], raws[len(raws)/4+1] // of one stored length
		for _, tc := range []struct {
			name   string
			bad    Block
			change func([]byte)
		}{
			{"raw bit", raws[len(raws)/3], func(f []byte) { f[raws[len(raws)/3].Off+4321] ^= 4 }},
			{"lz4 bit", lz4s[len(lz4s)/2], func(f []byte) { f[lz4s[len(lz4s)/2].Off+7] ^= 0x80 }},
			{"last raw bit", raws[len(raws)-1], func(f []byte) { f[raws[len(raws)-1].Off+uint64(raws[len(raws)-1].StoredLen)-1] ^= 1 }},
			{"raw block over another", rawB, func(f []byte) {
				copy(f[rawB.Off:rawB.Off+uint64(rawB.StoredLen)], f[rawA.Off:rawA.Off+uint64(rawA.StoredLen)])
			}},
		} {
			t.Run(authNames[v]+"/"+tc.name, func(t *testing.T) {
				d := changedCopy(t, dirs[v], pages, tc.change)
				r := openAuth(t, d, keys[v])
				lo := all[0].Addr
				hi := all[len(all)-1].End()
				check := func(how string, err error) {
					t.Helper()
					be, ok := errors.AsType[*BlockError](err)
					if !errors.Is(err, ErrAuth) || !ok || be.Block != tc.bad.Index || be.Addr != tc.bad.Addr || !strings.Contains(err.Error(), pages) {
						t.Errorf("%s: got %v, want an authentication failure of block %d at %#x of %s", how, err, tc.bad.Index, tc.bad.Addr, pages)
					}
				}
				buf := make([]byte, hi-lo)
				_, err := r.Uncached().ReadAt(buf, int64(lo))
				check("uncached, all of memory", err)
				_, err = r.Uncached().ReadAt(buf[:tc.bad.Len], int64(tc.bad.Addr))
				check("uncached, the block", err)
				_, err = r.Payloads().ReadAt(make([]byte, r.Stats().FileSize), 0)
				check("payloads, the whole file", err)
				_, err = r.ReadAt(buf[:tc.bad.Len], int64(tc.bad.Addr))
				check("cached, the block", err)
				err = r.Stream(context.Background(), lo, hi, true, func([]Chunk) error { return nil })
				check("stream", err)
				// As the restore's fill decodes the payloads: authenticated,
				// no CRC32C.
				cb := make([]codec.Block, len(all))
				for i, b := range all {
					cb[i] = codec.Block{Kind: b.Kind, Off: int64(b.Off), StoredLen: int(b.StoredLen), Len: int(b.Len), CRC: b.CRC}
				}
				err = codec.DecodeBlocks(context.Background(), r.Payloads(), cb, codec.DecodeOptions{Authenticated: true}, func(int, [][]byte) error { return nil })
				check("decode blocks", err)
			})
		}
	}
}

// TestSealedWindows: a sealed snapshot's Raw blocks are sealed in windows
// (feature sealed-windows, the window in the seal), one with every block
// whole still reads; a window reads and authenticates alone: a bit flipped
// in one window of a block leaves the others readable and that one
// refused, naming the block, and two windows of a block swapped, or the
// same window of two blocks, are refused.
func TestSealedWindows(t *testing.T) {
	dirs, keys := authSnapshots(t)
	ranges := authRanges()
	lo := ranges[0].addr
	want := expected(ranges, lo, lo+uint64(len(ranges[0].data)))
	for _, v := range []int{1, 3} {
		s, err := OpenWith(dirs[v], OpenOptions{Keys: keys[v]})
		if err != nil {
			t.Fatal(err)
		}
		if got, feat := s.Manifest.Seal.Window, s.Manifest.HasFeature(FeatureSealedWindows); (v == 1) != (got == seal.Window && feat) || (v == 3) != (got == 0 && !feat) {
			t.Fatalf("%s: window %d, feature %v", authNames[v], got, feat)
		}
		s.Close()
	}
	r := openAuth(t, dirs[1], keys[1])
	var raws []Block
	for b := range r.Blocks() {
		if b.Kind == codec.Raw {
			raws = append(raws, b)
		}
		if b.Kind == codec.Raw && b.Len > seal.Window != r.PageChecked(b) {
			t.Fatalf("block %d (%v, %d bytes): PageChecked %v", b.Index, b.Kind, b.Len, r.PageChecked(b))
		}
	}
	b := raws[len(raws)/2]
	for addr := b.Addr; addr < b.End(); addr += seal.Window {
		wlo, whi, ok := r.Unit(addr+PageSize, lazyUnit)
		if !ok || wlo != addr || whi != min(b.End(), addr+seal.Window) {
			t.Fatalf("Unit at %#x: [%#x, %#x) %v", addr+PageSize, wlo, whi, ok)
		}
		p := make([]byte, whi-wlo)
		if _, err := r.Uncached().ReadAt(p, int64(wlo)); err != nil || !bytes.Equal(p, want[wlo-lo:whi-lo]) {
			t.Fatalf("window at %#x differs (%v)", wlo, err)
		}
		// Inside a window, across two.
		q := make([]byte, seal.Window)
		at := wlo + 3000
		if at+uint64(len(q)) <= b.End() {
			if _, err := r.Uncached().ReadAt(q, int64(at)); err != nil || !bytes.Equal(q, want[at-lo:at-lo+uint64(len(q))]) {
				t.Fatalf("read at %#x across windows differs (%v)", at, err)
			}
		}
	}

	pages := filepath.Base(r.Name())
	other := raws[len(raws)/2+1]
	for _, tc := range []struct {
		name   string
		change func([]byte)
		bad    uint64 // the address of the window refused
		good   uint64 // and of one that still reads
	}{
		{"bit in a window", func(f []byte) { f[b.Off+2*seal.Window+99] ^= 8 }, b.Addr + 2*seal.Window, b.Addr + 3*seal.Window},
		{"two windows of a block swapped", func(f []byte) {
			w1 := bytes.Clone(f[b.Off : b.Off+seal.Window])
			copy(f[b.Off:], f[b.Off+seal.Window:b.Off+2*seal.Window])
			copy(f[b.Off+seal.Window:], w1)
		}, b.Addr, b.Addr + 2*seal.Window},
		{"window of another block", func(f []byte) {
			copy(f[b.Off+seal.Window:b.Off+2*seal.Window], f[other.Off+seal.Window:other.Off+2*seal.Window])
		}, b.Addr + seal.Window, b.Addr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := changedCopy(t, dirs[1], pages, tc.change)
			r := openAuth(t, d, keys[1])
			buf := make([]byte, seal.Window)
			if _, err := r.Uncached().ReadAt(buf, int64(tc.good)); err != nil || !bytes.Equal(buf, want[tc.good-lo:tc.good-lo+seal.Window]) {
				t.Errorf("an untouched window of the block: %v, or it differs", err)
			}
			for _, read := range []struct {
				how string
				f   func() error
			}{
				{"the window", func() error { _, err := r.Uncached().ReadAt(buf, int64(tc.bad)); return err }},
				{"the block", func() error { _, err := r.Uncached().ReadAt(make([]byte, b.Len), int64(b.Addr)); return err }},
				{"a page of the window, cached", func() error { _, err := r.ReadAt(buf[:PageSize], int64(tc.bad+PageSize)); return err }},
			} {
				err := read.f()
				be, ok := errors.AsType[*BlockError](err)
				if !errors.Is(err, ErrAuth) || !ok || be.Block != b.Index || be.Addr != b.Addr || !strings.Contains(err.Error(), pages) {
					t.Errorf("%s: %v, want an authentication failure of block %d at %#x of %s", read.how, err, b.Index, b.Addr, pages)
				}
			}
		})
	}
}

// lazyUnit is the unit size a lazy restore asks Reader.Unit for.
const lazyUnit = 16 << 10
