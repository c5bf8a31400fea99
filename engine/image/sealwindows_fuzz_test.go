package image

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"filippo.io/age"

	"github.com/lazyfs/lazyfs/engine/image/seal"
)

// bytesFile is a File of bytes.
type bytesFile struct{ *bytes.Reader }

func (bytesFile) Close() error { return nil }

// FuzzSealedPagesRead: whatever the pages file and the tag table of a
// sealed snapshot (Raw blocks sealed in windows, LZ4 blocks whole) are
// changed into, a read of its payloads either fails or returns the bytes
// the dump wrote; never a panic, never other bytes.
func FuzzSealedPagesRead(f *testing.F) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		f.Fatal(err)
	}
	keyFile := filepath.Join(f.TempDir(), "key.txt")
	os.WriteFile(keyFile, []byte(id.String()+"\n"), 0o600)
	so, err := sealOptions([]string{id.Recipient().String()})
	if err != nil {
		f.Fatal(err)
	}
	mem := make([]byte, 256<<10)
	synth("random", mem[:96<<10], 1)
	synth("records", mem[96<<10:160<<10], 2)
	synth("random", mem[160<<10:], 3)
	dir := filepath.Join(f.TempDir(), "snap")
	writeSnapshot(f, dir, 42, []memRange{{addr: 0x7f0000000000, data: mem}}, Options{BlockSize: 64 << 10, Seal: so})
	k, err := seal.LoadKeyring([]string{keyFile})
	if err != nil {
		f.Fatal(err)
	}
	s, err := OpenWith(dir, OpenOptions{Keys: k})
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	r, err := s.OpenPages(42, ReaderOptions{})
	if err != nil {
		f.Fatal(err)
	}
	defer r.Close()
	sp := r.src.(*sealedPages)
	if r.window == 0 || len(sp.units) <= len(r.lay.ix.Blocks) {
		f.Fatalf("window %d, %d units for %d blocks: not sealed in windows", r.window, len(sp.units), len(r.lay.ix.Blocks))
	}
	pages, err := os.ReadFile(filepath.Join(dir, s.Manifest.Processes[0].Pages))
	if err != nil {
		f.Fatal(err)
	}
	plain := make([]byte, len(pages))
	if n, err := sp.ReadAt(plain, 0); n != len(pages) || err != nil {
		f.Fatalf("read the payloads: %d, %v", n, err)
	}
	f.Add(pages, sp.tags, uint32(0), uint32(len(pages)))
	f.Add(pages, sp.tags, uint32(seal.Window-5), uint32(seal.Window+10))
	f.Add(pages, sp.tags[:len(sp.tags)-1], uint32(0), uint32(100))
	f.Fuzz(func(t *testing.T, file, tags []byte, off, n uint32) {
		n %= 1 << 20
		p, err := newSealedPages("pages", bytesFile{bytes.NewReader(file)}, r.lay, s.keys, r.window, 42, tags)
		if err != nil {
			if !errors.Is(err, ErrAuth) {
				t.Fatalf("tag table of %d bytes: %v, want ErrAuth", len(tags), err)
			}
			return
		}
		buf := make([]byte, n)
		got, err := p.ReadAt(buf, int64(off))
		if err != nil && !errors.Is(err, io.EOF) {
			return
		}
		if got > len(buf) {
			t.Fatalf("read %d bytes into %d", got, len(buf))
		}
		// What was read of the payloads is what the dump wrote (the
		// padding between them reads as stored, the plaintext's zeros).
		for i := 0; i < got; i++ {
			if at := int(off) + i; at < len(plain) && buf[i] != plain[at] && !padding(p, uint64(at)) {
				t.Fatalf("byte %d of the payloads read %#x, the dump wrote %#x", at, buf[i], plain[at])
			}
		}
	})
}

// padding reports whether offset at of the pages file is outside every
// unit (stored as is, not authenticated).
func padding(p *sealedPages, at uint64) bool {
	for _, u := range p.units {
		if at >= u.off && at < u.end() {
			return false
		}
	}
	return true
}
