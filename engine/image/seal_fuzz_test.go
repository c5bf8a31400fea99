package image

import (
	"bytes"
	"testing"

	"github.com/lazyfs/lazyfs/engine/image/seal"
)

// fuzzKeys are fixed keys for the fuzz targets of sealed files.
func fuzzKeys() *seal.Keys {
	var id [seal.IDSize]byte
	copy(id[:], "fuzz snapshot id")
	return seal.NewKeys(bytes.Repeat([]byte{7}, seal.KeySize), id)
}

// FuzzSealedFile: any bytes either authenticate as a sealed file of their
// role, process and snapshot, or fail with an error; never a panic, and
// the parts returned always add up to the plaintext.
func FuzzSealedFile(f *testing.F) {
	k := fuzzKeys()
	f.Add(sealFile(k, roleState, 3, []byte(`{"pid":3}`), 0), uint16(roleState), 3)
	f.Add(sealFile(k, roleIndex, 3, append(seedIndex(), make([]byte, 4*seal.TagSize)...), 4*seal.TagSize), uint16(roleIndex), 3)
	f.Add([]byte(sealMagic), uint16(roleState), 1)
	f.Add(make([]byte, sealHeaderSize+seal.TagSize), uint16(roleIndex), 0)
	f.Fuzz(func(t *testing.T, b []byte, role uint16, pid int) {
		main, aux, err := openFile(k, "f", b, role, pid)
		if err != nil {
			return
		}
		h, err := parseSealHeader(b)
		if err != nil {
			t.Fatalf("opened a file whose header does not parse: %v", err)
		}
		if uint64(len(aux)) != h.aux || len(main)+len(aux)+sealHeaderSize+seal.TagSize != len(b) {
			t.Fatalf("parts of %d and %d bytes from a file of %d", len(main), len(aux), len(b))
		}
		if role == roleIndex {
			UnmarshalIndex(main, -1)
		}
	})
}

// FuzzSealHeader: the clear header of a sealed file parses or fails, and
// what it accepts is bounded by the file.
func FuzzSealHeader(f *testing.F) {
	f.Add(sealFile(fuzzKeys(), roleIndex, 9, make([]byte, 100), 32))
	f.Add([]byte("LZFSSEAL\x01\x00\x40\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseSealHeader(b)
		if err != nil {
			return
		}
		if h.aux > uint64(len(b)-sealHeaderSize-seal.TagSize) {
			t.Fatalf("second part of %d bytes in a file of %d", h.aux, len(b))
		}
	})
}

// FuzzAuth: snapshot.auth parses or fails.
func FuzzAuth(f *testing.F) {
	f.Add((&authFile{flags: authMAC, mac: make([]byte, 32)}).marshal())
	f.Add((&authFile{flags: authMAC | authSig, mac: make([]byte, 32), sig: make([]byte, 64)}).marshal())
	f.Add([]byte(authMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		if a, err := parseAuth(b); err == nil && (len(a.mac) != 32 || len(a.sig) != 64 || a.flags == 0) {
			t.Fatalf("parsed %+v", a)
		}
	})
}
