package seal

import (
	"testing"

	"filippo.io/age"
)

// FuzzKeys: keys.age from anyone either opens with the identity as a
// lazyfs data key or fails; never a panic.
func FuzzKeys(f *testing.F) {
	id, err := age.ParseX25519Identity("AGE-SECRET-KEY-1GFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPQ4EGAEX")
	if err != nil {
		f.Fatal(err)
	}
	var sid [IDSize]byte
	good, err := WrapKey([]age.Recipient{id.Recipient()}, make([]byte, KeySize), sid)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte("age-encryption.org/v1\n-> X25519 \n"))
	k := &Keyring{ids: []age.Identity{id}}
	f.Fuzz(func(t *testing.T, b []byte) {
		data, _, err := UnwrapKey(b, k)
		if err == nil && len(data) != KeySize {
			t.Fatalf("data key of %d bytes", len(data))
		}
	})
}
