package image

import (
	"crypto/ed25519"
	"crypto/hmac"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/lazyfs/lazyfs/engine/image/seal"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

// Signed snapshots (the "signed" format feature): integrity and origin
// without secrecy. The manifest is signed with an ed25519 key (an OpenSSH
// key file, ssh-keygen -t ed25519) and holds the SHA-256 of every other
// small file; each block's SHA-256 is in a digests file per process. A
// snapshot can be both sealed and signed: its blocks are then
// authenticated by AES-GCM under a data key the signed manifest binds
// (the SHA-256 of keys.age), and it has no digests file.

// FeatureSigned is the format feature of a signed snapshot.
const FeatureSigned = "signed"

func init() { knownFeatures[FeatureSigned] = true }

// Signature is the "signature" object of a signed snapshot's manifest.
type Signature struct {
	Alg    string `json:"alg"`
	Digest string `json:"digest"`
	// Key is the signer's public key, as a line of authorized_keys. It
	// says who signed; a reader trusts only the keys it is given.
	Key string `json:"key"`
}

func digestsName(pid int) string { return fmt.Sprintf("digests-%d.img", pid) }

// checkSignature validates the manifest's signature object against its
// features.
func checkSignature(m *Manifest) error {
	if m.HasFeature(FeatureSigned) != (m.Signature != nil) {
		return fmt.Errorf("%w: feature %q and the signature object disagree", ErrCorrupt, FeatureSigned)
	}
	if m.Signature == nil {
		for _, p := range m.Processes {
			if p.Digests != "" {
				return fmt.Errorf("%w: process %d has a digests file but the snapshot is not signed", ErrCorrupt, p.PID)
			}
		}
		return nil
	}
	if s := m.Signature; s.Alg != seal.SignAlg || s.Digest != seal.SignDigest {
		return fmt.Errorf("%w: signature %s/%s, this build reads %s/%s", ErrVersion, s.Alg, s.Digest, seal.SignAlg, seal.SignDigest)
	}
	for _, p := range m.Processes {
		if p.PageCRCs != "" {
			return fmt.Errorf("%w: process %d of a signed snapshot has page checksums, which a page read would trust instead of the signed digests", ErrCorrupt, p.PID)
		}
		if (p.Digests == "") != (m.Seal != nil) {
			return fmt.Errorf("%w: process %d: a signed snapshot in clear has a digests file per process, a sealed one none", ErrCorrupt, p.PID)
		}
		if p.Digests != "" {
			if !safeName.MatchString(p.Digests) || p.Digests == ManifestName {
				return fmt.Errorf("%w: manifest names file %q", ErrCorrupt, p.Digests)
			}
			if _, ok := m.Files[p.Digests]; !ok {
				return fmt.Errorf("%w: manifest has no size and checksum for %q", ErrCorrupt, p.Digests)
			}
		}
	}
	for name, f := range m.Files {
		if _, err := hex.DecodeString(f.SHA256); (err != nil || len(f.SHA256) != 2*seal.DigestSize) && !isPages(m, name) {
			return fmt.Errorf("%w: signed manifest has no SHA-256 for %q", ErrCorrupt, name)
		}
	}
	return nil
}

// isPages reports whether name is a pages file of the manifest (whose
// blocks, not the whole file, are authenticated).
func isPages(m *Manifest, name string) bool {
	for _, p := range m.Processes {
		if p.Pages == name {
			return true
		}
	}
	return false
}

// authFile is snapshot.auth, which authenticates snapshot.json:
//
//	offset size field
//	     0    8 magic "LZFSAUTH"
//	     8    2 version (1)
//	    10    2 flags: 1 MAC present, 2 signature present
//	    12    4 reserved (0)
//	    16   32 HMAC-SHA256 of snapshot.json under the data key's manifest
//	            key (sealed snapshots; zeros otherwise)
//	    48   64 ed25519 signature of snapshot.json (signed snapshots;
//	            zeros otherwise)
type authFile struct {
	flags uint16
	mac   []byte
	sig   []byte
}

const (
	authMAC = 1
	authSig = 2
)

func (a *authFile) marshal() []byte {
	b := make([]byte, authSize)
	copy(b, authMagic)
	binary.LittleEndian.PutUint16(b[8:], authVersion)
	binary.LittleEndian.PutUint16(b[10:], a.flags)
	copy(b[16:48], a.mac)
	copy(b[48:112], a.sig)
	return b
}

// parseAuth parses snapshot.auth.
func parseAuth(b []byte) (*authFile, error) {
	if len(b) != authSize || string(b[:8]) != authMagic {
		return nil, fmt.Errorf("%w: not a manifest authenticator", ErrAuth)
	}
	le := binary.LittleEndian
	if v := le.Uint16(b[8:]); v != authVersion {
		return nil, fmt.Errorf("%w: version %d, this build reads %d", ErrVersion, v, authVersion)
	}
	a := &authFile{flags: le.Uint16(b[10:]), mac: b[16:48], sig: b[48:112]}
	if a.flags == 0 || a.flags&^(authMAC|authSig) != 0 {
		return nil, fmt.Errorf("%w: flags %#x", ErrAuth, a.flags)
	}
	return a, nil
}

// writeAuth writes snapshot.auth for manifest bytes b, before the
// manifest: a snapshot is complete only once its manifest is in place.
func (w *Writer) writeAuth(b []byte) error {
	a := authFile{}
	if w.keys != nil {
		a.flags |= authMAC
		a.mac = w.keys.ManifestMAC(b)
	}
	if w.signer != nil {
		a.flags |= authSig
		a.sig = ed25519.Sign(w.signer, b)
	}
	return w.putFile(AuthName, a.marshal()) // its errors name the file
}

// authenticate checks the manifest bytes raw of the snapshot in st (a
// directory or an object store) with the keyring, before anything of the
// manifest is used: every kind of key given must serve. With age
// identities the snapshot must be sealed, its data key opened by one of
// them and the manifest's MAC right; with signers' keys it must be
// signed, by one of them. It returns the opened keys (nil if the keyring
// has no age identity) and whether a signature was verified. Its own
// files (snapshot.auth, keys.age) are checked as every file of st is
// (store.Store.Stat: a plain file, not a link, that only the caller and root
// can change unless trusted).
func authenticate(st store.Store, raw []byte, k *seal.Keyring) (*seal.Keys, bool, error) {
	read := func(name string, limit int64, absent string) ([]byte, error) {
		size, err := st.Stat(name)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("%w: %s is %s (no %s), and a key for it was given (%s): refusing a snapshot it cannot authenticate",
					ErrNoIdentity, st, absent, name, strings.Join(k.Files(), ", "))
			}
			return nil, err
		}
		if size > limit {
			return nil, fmt.Errorf("%s: %w: larger than %d bytes", joinName(st.String(), name), ErrAuth, limit)
		}
		return readAll(st, name, size, false)
	}
	b, err := read(AuthName, authSize, "neither sealed nor signed")
	if err != nil {
		return nil, false, err
	}
	auth, err := parseAuth(b)
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", joinName(st.String(), AuthName), err)
	}
	var keys *seal.Keys
	if k.HasIdentities() {
		if auth.flags&authMAC == 0 {
			return nil, false, fmt.Errorf("%w: %s is not sealed, and an age identity was given (%s): refusing it", ErrNoIdentity, st, strings.Join(k.Files(), ", "))
		}
		wrapped, err := read(KeysName, seal.MaxKeysSize, "not sealed")
		if err != nil {
			return nil, false, err
		}
		data, id, err := seal.UnwrapKey(wrapped, k)
		if err != nil {
			return nil, false, fmt.Errorf("%s: %w", joinName(st.String(), KeysName), err)
		}
		keys = seal.NewKeys(data, id)
		if !hmac.Equal(auth.mac, keys.ManifestMAC(raw)) {
			return nil, false, fmt.Errorf("%s: %w: the manifest is not the one the dump wrote", joinName(st.String(), ManifestName), ErrAuth)
		}
	}
	signed := false
	if k.HasSigners() {
		if auth.flags&authSig == 0 {
			return nil, false, fmt.Errorf("%w: %s is not signed, and a signer's key was given (%s): refusing it", ErrNoIdentity, st, strings.Join(k.Files(), ", "))
		}
		if signed = k.Verify(raw, auth.sig); !signed {
			return nil, false, fmt.Errorf("%s: %w: its signature verifies with none of the keys of %s (changed, or signed by another key)",
				joinName(st.String(), ManifestName), ErrAuth, strings.Join(k.Files(), ", "))
		}
	}
	return keys, signed, nil
}

// checkKeys checks that a manifest's seal and signature agree with what
// authenticate opened and verified.
func checkKeys(dir string, m *Manifest, keys *seal.Keys, signed bool) error {
	switch {
	case m.Seal == nil && keys != nil:
		return fmt.Errorf("%w: %s: the manifest is not sealed but its directory holds a data key", ErrAuth, dir)
	case m.Signature == nil && signed:
		return fmt.Errorf("%w: %s: the manifest is not signed but a signature verified", ErrAuth, dir)
	case m.Seal != nil && keys == nil:
		return fmt.Errorf("%w: %s is encrypted for %s: give an identity that opens it (--identity FILE or %s)",
			ErrNoIdentity, dir, strings.Join(m.Seal.Recipients, ", "), seal.IdentityEnv)
	case m.Seal != nil && m.Seal.ID != hex.EncodeToString(keys.ID[:]):
		return fmt.Errorf("%w: %s: the data key is of another snapshot", ErrAuth, dir)
	case m.Signature != nil && !signed && keys == nil:
		return fmt.Errorf("%w: %s is signed by %s: give the signer's public key to verify it (--identity KEY.pub or %s)",
			ErrNoIdentity, dir, m.Signature.Key, seal.IdentityEnv)
	}
	return nil
}

// Signed reports whether the snapshot's signature was verified.
func (s *Snapshot) Signed() bool { return s.signed }
