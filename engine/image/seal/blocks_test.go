package seal

import (
	"bytes"
	"errors"
	"testing"
)

// TestSealOpen: a block sealed whole, or in windows, opens as itself
// only: under another identity, or a window as another window or as a
// whole block, it fails with ErrAuth.
func TestSealOpen(t *testing.T) {
	var id [IDSize]byte
	copy(id[:], "block test id 16")
	k := NewKeys(bytes.Repeat([]byte{3}, KeySize), id)
	stored := make([]byte, 3*Window+100)
	for i := range stored {
		stored[i] = byte(i * 7)
	}
	b := Block{ID: id, PID: 9, Index: 5, Addr: 0x400000, Len: uint32(len(stored)), Kind: 1, Stored: uint32(len(stored))}
	s := &Sealer{AEAD: k.Pages(9), Window: Window}

	whole := (&Sealer{AEAD: k.Pages(9)}).Seal(nil, &b, true, stored)
	if got, err := Open(k.Pages(9), nil, whole, &b, 0); err != nil || !bytes.Equal(got, stored) {
		t.Fatalf("whole block: %v", err)
	}
	other := b
	other.Index++
	if _, err := Open(k.Pages(9), nil, whole, &other, 0); !errors.Is(err, ErrAuth) {
		t.Fatalf("whole block under another index: %v, want ErrAuth", err)
	}
	if _, err := Open(k.Pages(10), nil, whole, &b, 0); !errors.Is(err, ErrAuth) {
		t.Fatalf("whole block under another process's key: %v, want ErrAuth", err)
	}

	if !Windowed(Window, true, b.Stored) || Windowed(Window, false, b.Stored) || Windowed(0, true, b.Stored) {
		t.Fatal("Windowed: a large Raw block is windowed, another kind or no window is not")
	}
	n := Windows(Window, b.Stored)
	out := s.Seal(nil, &b, true, stored)
	if want := len(stored) + int(n)*TagSize; len(out) != want {
		t.Fatalf("windows sealed into %d bytes, want %d", len(out), want)
	}
	tags := out[len(stored):]
	for win := uint64(0); win < n; win++ {
		lo, hi := win*Window, min(uint64(len(stored)), (win+1)*Window)
		ct := append(bytes.Clone(out[lo:hi]), tags[win*TagSize:(win+1)*TagSize]...)
		got, err := Open(k.Pages(9), nil, ct, &b, uint32(win+1))
		if err != nil || !bytes.Equal(got, stored[lo:hi]) {
			t.Fatalf("window %d: %v", win+1, err)
		}
		if win+2 <= n {
			if _, err := Open(k.Pages(9), nil, ct, &b, uint32(win+2)); !errors.Is(err, ErrAuth) {
				t.Fatalf("window %d opened as window %d: %v, want ErrAuth", win+1, win+2, err)
			}
		}
		if _, err := Open(k.Pages(9), nil, ct, &b, 0); !errors.Is(err, ErrAuth) {
			t.Fatalf("window %d opened as a whole block: %v, want ErrAuth", win+1, err)
		}
	}
}

// TestManifestMAC: the manifest's MAC depends on the data key and the
// snapshot id.
func TestManifestMAC(t *testing.T) {
	data, id := NewDataKey()
	k := NewKeys(data, id)
	m := []byte(`{"version":1}`)
	if !bytes.Equal(k.ManifestMAC(m), NewKeys(data, id).ManifestMAC(m)) {
		t.Fatal("the same keys give another MAC")
	}
	id[0] ^= 1
	if bytes.Equal(k.ManifestMAC(m), NewKeys(data, id).ManifestMAC(m)) {
		t.Fatal("another snapshot id gives the same MAC")
	}
}
