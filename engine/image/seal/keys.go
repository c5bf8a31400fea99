package seal

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"strings"

	"filippo.io/age"
)

// The algorithms of a sealed snapshot, as its manifest names them, and
// the sizes of its keys, identity, tags and nonces.
const (
	AEAD = "AES-256-GCM"
	KDF  = "HKDF-SHA256"
	Wrap = "age"

	KeySize   = 32
	IDSize    = 16
	TagSize   = 16
	NonceSize = 12

	keysMagic   = "LZFSKEY1"
	keysPayload = len(keysMagic) + IDSize + KeySize
	// MaxKeysSize bounds keys.age, the wrapped data key, before it is
	// read.
	MaxKeysSize = 1 << 20
)

// Keys are the keys of one opened or written sealed snapshot, all
// derived from its data key.
type Keys struct {
	// ID is the snapshot's random identity, bound into every key and
	// every block's authentication.
	ID       [IDSize]byte
	manifest []byte      // HMAC-SHA256 key of snapshot.json
	files    cipher.AEAD // sealed files
	data     []byte      // the data key, for the per-process page keys
}

// derive returns a key of the snapshot for purpose info.
func derive(data []byte, id [IDSize]byte, info string) []byte {
	k, err := hkdf.Key(sha256.New, data, id[:], "lazyfs "+info, KeySize)
	if err != nil {
		panic(err) // only for lengths past HKDF's limit
	}
	return k
}

func newGCM(key []byte) cipher.AEAD {
	b, err := aes.NewCipher(key)
	if err != nil {
		panic(err) // key length is fixed
	}
	g, err := cipher.NewGCM(b)
	if err != nil {
		panic(err)
	}
	return g
}

// NewKeys returns the keys of the snapshot id whose data key is data.
func NewKeys(data []byte, id [IDSize]byte) *Keys {
	return &Keys{ID: id, data: data,
		manifest: derive(data, id, "manifest mac"),
		files:    newGCM(derive(data, id, "sealed files"))}
}

// Files returns the AEAD of the sealed files (state, index).
func (k *Keys) Files() cipher.AEAD { return k.files }

// Pages returns the AEAD of the blocks of process pid.
func (k *Keys) Pages(pid int) cipher.AEAD {
	return newGCM(derive(k.data, k.ID, fmt.Sprintf("pages %d", pid)))
}

// ManifestMAC returns the MAC of the manifest bytes b.
func (k *Keys) ManifestMAC(b []byte) []byte {
	h := hmac.New(sha256.New, k.manifest)
	h.Write(b)
	return h.Sum(nil)
}

// NewDataKey returns a fresh data key and snapshot id.
func NewDataKey() (data []byte, id [IDSize]byte) {
	data = make([]byte, KeySize)
	rand.Read(data)
	rand.Read(id[:])
	return data, id
}

// WrapKey returns keys.age: the id and data key, age-encrypted for the
// recipients.
func WrapKey(recipients []age.Recipient, data []byte, id [IDSize]byte) ([]byte, error) {
	var out bytes.Buffer
	w, err := age.Encrypt(&out, recipients...)
	if err != nil {
		return nil, fmt.Errorf("wrap the data key: %w", err)
	}
	w.Write([]byte(keysMagic))
	w.Write(id[:])
	w.Write(data)
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("wrap the data key: %w", err)
	}
	return out.Bytes(), nil
}

// UnwrapKey opens keys.age with the keyring's identities and returns the
// data key and the snapshot id.
func UnwrapKey(b []byte, k *Keyring) ([]byte, [IDSize]byte, error) {
	var id [IDSize]byte
	r, err := age.Decrypt(bytes.NewReader(b), k.ids...)
	if err != nil {
		var nm *age.NoIdentityMatchError
		if errors.As(err, &nm) {
			return nil, id, fmt.Errorf("%w: none of the identities of %s opens it", ErrNoIdentity, strings.Join(k.files, ", "))
		}
		return nil, id, fmt.Errorf("%w: %v", ErrAuth, err)
	}
	p, err := io.ReadAll(io.LimitReader(r, int64(keysPayload)+1))
	if err != nil {
		return nil, id, fmt.Errorf("%w: %v", ErrAuth, err)
	}
	if len(p) != keysPayload || string(p[:len(keysMagic)]) != keysMagic {
		return nil, id, fmt.Errorf("%w: not a lazyfs data key", ErrAuth)
	}
	copy(id[:], p[len(keysMagic):])
	return p[len(keysMagic)+IDSize:], id, nil
}
