package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image/seal"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

// sealed writes a sealed snapshot of layoutRanges for a new identity and
// returns its directory, ranges and a keyring that opens it.
func sealed(t *testing.T, blockSize int) (string, []memRange, *seal.Keyring) {
	return sealedMode(t, blockSize, codec.Compress)
}

// TestSealedCodecs reads back sealed snapshots of every codec.
func TestSealedCodecs(t *testing.T) {
	for _, m := range codec.Modes {
		dir, ranges, k := sealedMode(t, 64<<10, m)
		if err := readSnapshot(dir, k); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		s, _ := OpenWith(dir, OpenOptions{Keys: k})
		r, err := s.OpenPages(42, ReaderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		lo, hi := ranges[0].addr, ranges[len(ranges)-1].addr+uint64(len(ranges[len(ranges)-1].data))
		got := make([]byte, hi-lo)
		if _, err := r.Uncached().ReadAt(got, int64(lo)); err != nil || !bytes.Equal(got, expected(ranges, lo, hi)) {
			t.Fatalf("%s: read back differs (%v)", m, err)
		}
		r.Close()
		s.Close()
	}
}

func sealedMode(t *testing.T, blockSize int, mode codec.Mode) (string, []memRange, *seal.Keyring) {
	t.Helper()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(t.TempDir(), "key.txt")
	if err := os.WriteFile(keyFile, []byte(id.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	so, err := sealOptions([]string{id.Recipient().String()})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	ranges := layoutRanges(11)
	writeSnapshot(t, dir, 42, ranges, Options{BlockSize: blockSize, Seal: so, Mode: mode})
	k, err := seal.LoadKeyring([]string{keyFile})
	if err != nil {
		t.Fatal(err)
	}
	return dir, ranges, k
}

func TestSealedRoundTrip(t *testing.T) {
	for _, bs := range []int{4 << 10, 256 << 10} {
		dir, ranges, k := sealed(t, bs)
		s, err := OpenWith(dir, OpenOptions{Keys: k})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if !s.Sealed() || !s.Manifest.HasFeature(FeatureSealed) {
			t.Fatal("not sealed")
		}
		st, err := s.State(42)
		if err != nil || st.Comm != "synth" {
			t.Fatalf("state %+v, %v", st, err)
		}
		r, err := s.OpenPages(42, ReaderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		lo, hi := ranges[0].addr, ranges[len(ranges)-1].addr+uint64(len(ranges[len(ranges)-1].data))
		want := expected(ranges, lo, hi)
		got := make([]byte, hi-lo)
		if _, err := r.ReadAt(got, int64(lo)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("bs %d: cached read differs", bs)
		}
		clear(got)
		if _, err := r.Uncached().ReadAt(got, int64(lo)); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("bs %d: uncached read differs (%v)", bs, err)
		}
		// Reads that start and end inside blocks.
		for _, off := range []uint64{lo + 100, lo + uint64(bs) + 4095} {
			p := make([]byte, 3*PageSize+17)
			if _, err := r.Uncached().ReadAt(p, int64(off)); err != nil || !bytes.Equal(p, want[off-lo:off-lo+uint64(len(p))]) {
				t.Fatalf("bs %d: read at %#x differs (%v)", bs, off, err)
			}
		}
		if err := r.Verify(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		// No plaintext page of the memory appears in any file.
		for _, name := range append([]string{ManifestName, AuthName}, keys(s.Manifest.Files)...) {
			b, _ := os.ReadFile(filepath.Join(dir, name))
			for _, mr := range ranges {
				for off := 0; off+64 <= len(mr.data); off += PageSize {
					if p := mr.data[off : off+64]; !codec.IsZero(p) && bytes.Contains(b, p) {
						t.Fatalf("%s holds plaintext of %#x", name, mr.addr+uint64(off))
					}
				}
			}
		}
		if b, _ := os.ReadFile(filepath.Join(dir, s.Manifest.Processes[0].State)); bytes.Contains(b, []byte("synth")) {
			t.Fatal("state in clear")
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestSealedRefusals(t *testing.T) {
	dir, _, k := sealed(t, 64<<10)
	if _, err := Open(dir); !errors.Is(err, ErrNoIdentity) || !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "age1") {
		t.Fatalf("no identity: %v", err)
	}
	other, _ := age.GenerateX25519Identity()
	f := filepath.Join(t.TempDir(), "other.txt")
	os.WriteFile(f, []byte(other.String()+"\n"), 0o600)
	ok, err := seal.LoadKeyring([]string{f})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenWith(dir, OpenOptions{Keys: ok}); !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("other identity: %v", err)
	}
	// An identity for a snapshot that is not sealed.
	plain := filepath.Join(t.TempDir(), "plain")
	writeSnapshot(t, plain, 42, layoutRanges(2), Options{})
	if _, err := OpenWith(plain, OpenOptions{Keys: k}); !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("unsealed with identity: %v", err)
	}
	if m, err := PeekManifest(dir, store.Options{}); err != nil || m.Seal == nil || len(m.Seal.Recipients) != 1 {
		t.Fatalf("peek: %+v %v", m, err)
	}
}

// copyDir copies a snapshot directory.
func copyDir(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "copy")
	os.Mkdir(out, 0o700)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(out, e.Name()), b, 0o600)
	}
	return out
}

// changedCopy copies a snapshot directory and changes the bytes of its
// file name with change.
func changedCopy(t *testing.T, dir, name string, change func([]byte)) string {
	t.Helper()
	d := copyDir(t, dir)
	p := filepath.Join(d, name)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	change(b)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return d
}

// readSnapshot opens the snapshot and reads all of it: state and memory.
func readSnapshot(dir string, k *seal.Keyring) error {
	s, err := OpenWith(dir, OpenOptions{Keys: k})
	if err != nil {
		return err
	}
	defer s.Close()
	if _, err := s.State(42); err != nil {
		return err
	}
	r, err := s.OpenPages(42, ReaderOptions{})
	if err != nil {
		return err
	}
	defer r.Close()
	return r.Verify(context.Background(), nil)
}

func TestSealedTamper(t *testing.T) {
	dir, _, k := sealed(t, 64<<10)
	s, err := OpenWith(dir, OpenOptions{Keys: k})
	if err != nil {
		t.Fatal(err)
	}
	e := s.Manifest.Processes[0]
	r, err := s.OpenPages(42, ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var stored []Block
	for b := range r.Blocks() {
		if b.Kind != codec.Zero {
			stored = append(stored, b)
		}
	}
	r.Close()
	s.Close()
	flip := func(name string, off int64) func(string) {
		return func(d string) {
			p := filepath.Join(d, name)
			b, _ := os.ReadFile(p)
			if off < 0 {
				off += int64(len(b))
			}
			b[off] ^= 0x10
			os.WriteFile(p, b, 0o600)
		}
	}
	var a, b Block // two stored blocks of one length
	for i := range stored {
		for j := i + 1; j < len(stored) && a.Len == 0; j++ {
			if stored[i].StoredLen == stored[j].StoredLen {
				a, b = stored[i], stored[j]
			}
		}
	}
	if a.Len == 0 {
		t.Fatal("no two blocks of one stored length")
	}
	for _, tc := range []struct {
		name   string
		change func(string)
		names  string // what the error must name
	}{
		{"block", flip(e.Pages, int64(stored[len(stored)/2].Off)+5), e.Pages},
		{"index", flip(e.Index, 100), e.Index},
		{"index header", flip(e.Index, 20), e.Index},
		{"state", flip(e.State, -3), e.State},
		{"manifest", func(d string) {
			p := filepath.Join(d, ManifestName)
			b, _ := os.ReadFile(p)
			b = bytes.Replace(b, []byte(`"tool": "`), []byte(`"tool": "x`), 1)
			os.WriteFile(p, b, 0o600)
		}, ManifestName},
		{"keys", flip(KeysName, -5), KeysName},
		{"auth", flip(AuthName, 20), ManifestName},
		{"block copied over another", func(d string) {
			p := filepath.Join(d, e.Pages)
			buf, _ := os.ReadFile(p)
			copy(buf[b.Off:b.Off+uint64(b.StoredLen)], buf[a.Off:a.Off+uint64(a.StoredLen)])
			os.WriteFile(p, buf, 0o600)
		}, e.Pages},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := copyDir(t, dir)
			tc.change(d)
			err := readSnapshot(d, k)
			if !errors.Is(err, ErrAuth) || !errors.Is(err, ErrUntrusted) {
				t.Fatalf("got %v, want an authentication failure", err)
			}
			if !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("%v does not name %s", err, tc.names)
			}
			if be, ok := errors.AsType[*BlockError](err); ok && tc.names == e.Pages {
				t.Logf("%v", be)
			}
		})
	}
}

// BenchmarkSealedReadAt is BenchmarkReadAt's uncached read of a snapshot
// in clear and of the same memory sealed, and their Verify (Stream).
func BenchmarkSealedReadAt(b *testing.B) {
	const size = 128 << 20
	data := make([]byte, size)
	synth("random", data[:size*3/4], 1)
	for i := size * 3 / 4; i < size; i++ {
		data[i] = "lazyfs-"[i%7]
	}
	ranges := []memRange{{addr: 0x10000000, data: data}}
	id, _ := age.GenerateX25519Identity()
	keyFile := filepath.Join(b.TempDir(), "key.txt")
	os.WriteFile(keyFile, []byte(id.String()+"\n"), 0o600)
	k, _ := seal.LoadKeyring([]string{keyFile})
	so, _ := sealOptions([]string{id.Recipient().String()})
	for _, sealed := range []bool{false, true} {
		dir := filepath.Join(b.TempDir(), "snap")
		o := Options{}
		var keys *seal.Keyring
		if sealed {
			o.Seal, keys = so, k
		}
		writeSnapshot(b, dir, 42, ranges, o)
		s, err := OpenWith(dir, OpenOptions{Keys: keys})
		if err != nil {
			b.Fatal(err)
		}
		r, err := s.OpenPages(42, ReaderOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("sealed=%v/pread", sealed), func(b *testing.B) {
			buf := make([]byte, 1<<20)
			b.SetBytes(size)
			for range b.N {
				for off := int64(0); off < int64(r.stats.FileSize); off += int64(len(buf)) {
					r.f.ReadAt(buf, off)
				}
			}
		})
		b.Run(fmt.Sprintf("sealed=%v/uncached", sealed), func(b *testing.B) {
			buf := make([]byte, 1<<20)
			b.SetBytes(size)
			for range b.N {
				for off := uint64(0); off < size; off += uint64(len(buf)) {
					if _, err := r.Uncached().ReadAt(buf, int64(0x10000000+off)); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		b.Run(fmt.Sprintf("sealed=%v/verify", sealed), func(b *testing.B) {
			b.SetBytes(size)
			for range b.N {
				if err := r.Verify(context.Background(), nil); err != nil {
					b.Fatal(err)
				}
			}
		})
		r.Close()
		s.Close()
	}
}

// TestSealedMixed: a restore through a mount (Reader.Mixed) reads a sealed
// snapshot's Raw blocks from the pages file, decrypted and authenticated
// there (a bit changed in one is refused, naming it), and asks the mount
// only for the blocks to decode; a fault's unit is the seal's window
// around it in a Raw block larger than it (sealed in windows), else the
// whole block, as a sealed snapshot has no page checksums.
func TestSealedMixed(t *testing.T) {
	dir, ranges, k := sealed(t, 64<<10)
	s, err := OpenWith(dir, OpenOptions{Keys: k})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := s.OpenPages(42, ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var lz4 uint64
	var raw []Block
	for b := range r.Blocks() {
		switch b.Kind {
		case codec.LZ4:
			lz4 += uint64(b.Len)
		case codec.Raw:
			raw = append(raw, b)
		}
		if b.Kind == codec.Zero {
			continue
		}
		// A Raw block larger than the seal's window is read and
		// authenticated window by window; any other block whole.
		addr := b.Addr + uint64(b.Len)/2 + 5
		wlo, whi := b.Addr, b.End()
		if b.Kind == codec.Raw && b.Len > seal.Window {
			wlo = b.Addr + (addr-b.Addr)/seal.Window*seal.Window
			whi = min(b.End(), wlo+seal.Window)
		}
		if got, want := r.PageChecked(b), wlo != b.Addr || whi != b.End(); got != want {
			t.Errorf("block %d (%v, %d bytes) of a sealed snapshot: PageChecked %v, want %v", b.Index, b.Kind, b.Len, got, want)
		}
		if lo, hi, ok := r.Unit(addr, 4*PageSize); !ok || lo != wlo || hi != whi {
			t.Errorf("Unit in block %d at %#x+%#x: [%#x, %#x) %v, want [%#x, %#x)", b.Index, b.Addr, b.Len, lo, hi, ok, wlo, whi)
		}
	}
	if lz4 == 0 || len(raw) == 0 {
		t.Fatalf("want both Raw and LZ4 blocks: %d bytes of LZ4, %d Raw blocks", lz4, len(raw))
	}
	src := &bytesSource{countingSource: countingSource{memSource: memSource{ranges: ranges}}}
	m := r.Mixed(r.Checked(src))
	for b := range r.Blocks() {
		buf := make([]byte, b.Len)
		if _, err := m.ReadAt(buf, int64(b.Addr)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, expected(ranges, b.Addr, b.End())) {
			t.Fatalf("block %d (%v) read through Mixed differs from the memory dumped", b.Index, b.Kind)
		}
	}
	if uint64(src.bytes) != lz4 {
		t.Errorf("read %d bytes from the decoded source block by block, want the %d of the LZ4 blocks", src.bytes, lz4)
	}

	// A Raw block changed in the pages file: Mixed refuses it.
	d := copyDir(t, dir)
	b := raw[len(raw)/2]
	p := filepath.Join(d, s.Manifest.Processes[0].Pages)
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	data[b.Off+uint64(b.StoredLen)/2] ^= 1
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	s2, err := OpenWith(d, OpenOptions{Keys: k})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	r2, err := s2.OpenPages(42, ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	buf := make([]byte, b.Len)
	_, err = r2.Mixed(r2.Checked(src)).ReadAt(buf, int64(b.Addr))
	if be, ok := errors.AsType[*BlockError](err); !ok || be.Block != b.Index || !errors.Is(err, ErrAuth) {
		t.Errorf("Mixed read of a changed Raw block: %v, want ErrAuth naming block %d", err, b.Index)
	}
}

// sealOptions seals for the recipients args name (seal.ParseRecipients).
func sealOptions(args []string) (*SealOptions, error) {
	rs, names, err := seal.ParseRecipients(args)
	if err != nil {
		return nil, err
	}
	return &SealOptions{Recipients: rs, Names: names}, nil
}
