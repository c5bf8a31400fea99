package image

import (
	"bytes"
	"testing"

	"filippo.io/age"
)

// fuzzKeys are fixed keys for the fuzz targets of sealed files.
func fuzzKeys() *sealKeys {
	var id [idSize]byte
	copy(id[:], "fuzz snapshot id")
	return newSealKeys(bytes.Repeat([]byte{7}, keySize), id)
}

// FuzzSealedFile: any bytes either authenticate as a sealed file of their
// role, process and snapshot, or fail with an error; never a panic, and
// the parts returned always add up to the plaintext.
func FuzzSealedFile(f *testing.F) {
	k := fuzzKeys()
	f.Add(k.sealFile(roleState, 3, []byte(`{"pid":3}`), 0), uint16(roleState), 3)
	f.Add(k.sealFile(roleIndex, 3, append(seedIndex(), make([]byte, 4*tagSize)...), 4*tagSize), uint16(roleIndex), 3)
	f.Add([]byte(sealMagic), uint16(roleState), 1)
	f.Add(make([]byte, sealHeaderSize+tagSize), uint16(roleIndex), 0)
	f.Fuzz(func(t *testing.T, b []byte, role uint16, pid int) {
		main, aux, err := k.openFile("f", b, role, pid)
		if err != nil {
			return
		}
		h, err := parseSealHeader(b)
		if err != nil {
			t.Fatalf("opened a file whose header does not parse: %v", err)
		}
		if uint64(len(aux)) != h.aux || len(main)+len(aux)+sealHeaderSize+tagSize != len(b) {
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
	f.Add(fuzzKeys().sealFile(roleIndex, 9, make([]byte, 100), 32))
	f.Add([]byte("LZFSSEAL\x01\x00\x40\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseSealHeader(b)
		if err != nil {
			return
		}
		if h.aux > uint64(len(b)-sealHeaderSize-tagSize) {
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

// FuzzKeys: keys.age from anyone either opens with the identity as a
// lazyfs data key or fails; never a panic.
func FuzzKeys(f *testing.F) {
	id, err := age.ParseX25519Identity("AGE-SECRET-KEY-1GFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPQ4EGAEX")
	if err != nil {
		f.Fatal(err)
	}
	so := &SealOptions{Recipients: []age.Recipient{id.Recipient()}}
	var sid [idSize]byte
	good, err := wrapKey(so, make([]byte, keySize), sid)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte("age-encryption.org/v1\n-> X25519 \n"))
	k := &Keyring{ids: []age.Identity{id}}
	f.Fuzz(func(t *testing.T, b []byte) {
		data, _, err := unwrapKey(b, k)
		if err == nil && len(data) != keySize {
			t.Fatalf("data key of %d bytes", len(data))
		}
	})
}
