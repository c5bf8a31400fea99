package image

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"filippo.io/age"

	"github.com/lazyfs/lazyfs/engine/image/seal"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

// Sealed snapshots (the "sealed" format feature): encrypted and
// authenticated. See doc.go, "Sealed snapshots", for the layout and the
// reasons.

// FeatureSealed is the format feature of a sealed snapshot.
const FeatureSealed = "sealed"

func init() { knownFeatures[FeatureSealed] = true }

// Names and sizes of a sealed snapshot's own files.
const (
	// KeysName holds the snapshot's data key, age-encrypted for each
	// recipient.
	KeysName = "keys.age"
	// AuthName holds the MAC of snapshot.json. It is not listed in the
	// manifest (it covers it).
	AuthName = "snapshot.auth"

	authMagic   = "LZFSAUTH"
	authVersion = 1
	authSize    = 112 // see authFile

	sealMagic      = "LZFSSEAL"
	sealVersion    = 1
	sealHeaderSize = 64
)

// Roles of a sealed file, bound into its authentication.
const (
	roleState = 1
	roleIndex = 2
)

var (
	// ErrAuth: part of a sealed snapshot fails its authentication: it is
	// not what the dump wrote (changed, damaged, or moved from elsewhere).
	// It matches ErrUntrusted (exit status 8); the error wrapping it names
	// the file, and the block and address for memory. It is seal.ErrAuth.
	ErrAuth = seal.ErrAuth
	// ErrNoIdentity: a sealed snapshot and no identity that opens it, or
	// an identity given for a snapshot that is not sealed. It matches
	// ErrUntrusted. It is seal.ErrNoIdentity.
	ErrNoIdentity = seal.ErrNoIdentity
)

// Seal is the "seal" object of a sealed snapshot's manifest: how it is
// sealed and for whom. What it says is authenticated with the rest of
// the manifest once a reader has the data key.
type Seal struct {
	// ID is the snapshot's random identity (hex), bound into every key
	// and every block's authentication.
	ID         string   `json:"id"`
	AEAD       string   `json:"aead"`
	KDF        string   `json:"kdf"`
	Wrap       string   `json:"key_wrap"`
	Recipients []string `json:"recipients"`
	// Window is the size of the windows that Raw blocks larger than it
	// are sealed in (feature "sealed-windows", sealwindows.go); 0: every
	// block is sealed whole.
	Window uint64 `json:"window,omitempty"`
}

// checkSeal validates the manifest's seal against its features.
func checkSeal(m *Manifest) error {
	if m.HasFeature(FeatureSealed) != (m.Seal != nil) {
		return fmt.Errorf("%w: feature %q and the seal object disagree", ErrCorrupt, FeatureSealed)
	}
	if m.Seal == nil {
		return nil
	}
	s := m.Seal
	if id, err := hex.DecodeString(s.ID); err != nil || len(id) != seal.IDSize {
		return fmt.Errorf("%w: seal id %q", ErrCorrupt, s.ID)
	}
	if s.AEAD != seal.AEAD || s.KDF != seal.KDF || s.Wrap != seal.Wrap {
		return fmt.Errorf("%w: seal %s/%s/%s, this build reads %s/%s/%s", ErrVersion, s.AEAD, s.KDF, s.Wrap, seal.AEAD, seal.KDF, seal.Wrap)
	}
	if _, ok := m.Files[KeysName]; !ok {
		return fmt.Errorf("%w: sealed manifest lists no %s", ErrCorrupt, KeysName)
	}
	if err := checkSealWindow(m); err != nil {
		return err
	}
	for _, p := range m.Processes {
		if p.PageCRCs != "" {
			return fmt.Errorf("%w: process %d of a sealed snapshot has page checksums (of its plaintext)", ErrCorrupt, p.PID)
		}
	}
	return nil
}

// SealOptions make Create write a sealed snapshot: its data key is
// wrapped for each of Recipients (seal.ParseRecipients).
type SealOptions struct {
	Recipients []age.Recipient
	// Names are the recipients as the manifest records them ("for
	// whom"), one per recipient.
	Names []string
	// whole seals every block whole, as before sealed windows (the
	// tests of older snapshots).
	whole bool
}

// sealHeader is the clear header of a sealed file (state, index).
//
//	offset size field
//	     0    8 magic "LZFSSEAL"
//	     8    2 version (1)
//	    10    2 header size (64)
//	    12    2 role: 1 process state, 2 page index
//	    14    2 reserved (0)
//	    16    8 pid
//	    24   16 snapshot id
//	    40   12 nonce
//	    52    4 reserved (0)
//	    56    8 length of the plaintext's second part (the block tags of
//	            an index; 0 for a state)
//	    64    . AES-256-GCM ciphertext and tag, with the header as
//	            associated data
type sealHeader struct {
	role  uint16
	pid   uint64
	id    [seal.IDSize]byte
	nonce [seal.NonceSize]byte
	aux   uint64
}

func (h *sealHeader) marshal() []byte {
	b := make([]byte, sealHeaderSize)
	copy(b, sealMagic)
	le := binary.LittleEndian
	le.PutUint16(b[8:], sealVersion)
	le.PutUint16(b[10:], sealHeaderSize)
	le.PutUint16(b[12:], h.role)
	le.PutUint64(b[16:], h.pid)
	copy(b[24:], h.id[:])
	copy(b[40:], h.nonce[:])
	le.PutUint64(b[56:], h.aux)
	return b
}

// parseSealHeader parses and bounds the header of a sealed file of n
// bytes (b holds at least the header).
func parseSealHeader(b []byte) (*sealHeader, error) {
	if len(b) < sealHeaderSize {
		return nil, fmt.Errorf("%w: sealed file of %d bytes, header needs %d", ErrTruncated, len(b), sealHeaderSize)
	}
	if string(b[:8]) != sealMagic {
		return nil, ErrBadMagic
	}
	le := binary.LittleEndian
	if v := le.Uint16(b[8:]); v != sealVersion {
		return nil, fmt.Errorf("%w: sealed file version %d, this build reads %d", ErrVersion, v, sealVersion)
	}
	if hs := le.Uint16(b[10:]); hs != sealHeaderSize {
		return nil, fmt.Errorf("%w: sealed header size %d", ErrCorrupt, hs)
	}
	h := &sealHeader{role: le.Uint16(b[12:]), pid: le.Uint64(b[16:]), aux: le.Uint64(b[56:])}
	copy(h.id[:], b[24:])
	copy(h.nonce[:], b[40:])
	if body := uint64(len(b) - sealHeaderSize); body < seal.TagSize || h.aux > body-seal.TagSize {
		return nil, fmt.Errorf("%w: sealed file of %d bytes holds %d bytes of second part", ErrCorrupt, len(b), h.aux)
	}
	return h, nil
}

// sealFile returns the sealed file of plaintext (main part then aux
// bytes of second part).
func sealFile(k *seal.Keys, role uint16, pid int, plaintext []byte, aux int) []byte {
	h := sealHeader{role: role, pid: uint64(pid), id: k.ID, aux: uint64(aux)}
	rand.Read(h.nonce[:])
	hdr := h.marshal()
	return k.Files().Seal(hdr, h.nonce[:], plaintext, hdr)
}

// openFile authenticates and decrypts sealed file b, which must be of
// role and pid in this snapshot, and returns its two parts.
func openFile(k *seal.Keys, name string, b []byte, role uint16, pid int) ([]byte, []byte, error) {
	h, err := parseSealHeader(b)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	if h.role != role || h.pid != uint64(pid) || h.id != k.ID {
		return nil, nil, fmt.Errorf("%s: %w: sealed for another file, process or snapshot", name, ErrAuth)
	}
	pt, err := k.Files().Open(nil, h.nonce[:], b[sealHeaderSize:], b[:sealHeaderSize])
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, ErrAuth)
	}
	cut := uint64(len(pt)) - h.aux
	return pt[:cut], pt[cut:], nil
}

func sealedStateName(pid int) string { return fmt.Sprintf("process-%d.sealed", pid) }
func sealedIndexName(pid int) string { return fmt.Sprintf("pagemap-%d.sealed", pid) }

// Sealed reports whether the snapshot is sealed (and was opened with a
// key).
func (s *Snapshot) Sealed() bool { return s.keys != nil }

// PeekManifest reads and parses the manifest of dir (a directory, or an
// address whose store o configures) without checking anything else, nor
// authenticating it: for snapctl inspect to say how a snapshot it cannot
// open is sealed, and for whom.
func PeekManifest(dir string, o store.Options) (*Manifest, error) {
	st, err := OpenStore(dir, OpenOptions{Trust: true, Remote: o})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	b, err := readManifestBytes(st)
	if err != nil {
		return nil, err
	}
	m, err := parseManifest(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", joinName(dir, ManifestName), err)
	}
	return m, nil
}
