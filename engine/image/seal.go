package image

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"filippo.io/age"
	"golang.org/x/sys/unix"

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

	sealAEAD = "AES-256-GCM"
	sealKDF  = "HKDF-SHA256"
	sealWrap = "age"

	keySize   = 32
	idSize    = 16
	tagSize   = 16
	nonceSize = 12

	keysMagic   = "LZFSKEY1"
	keysPayload = len(keysMagic) + idSize + keySize
	maxKeysSize = 1 << 20

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
	// the file, and the block and address for memory.
	ErrAuth error = &untrusted{"authentication failed"}
	// ErrNoIdentity: a sealed snapshot and no identity that opens it, or
	// an identity given for a snapshot that is not sealed. It matches
	// ErrUntrusted.
	ErrNoIdentity error = &untrusted{"no identity for the snapshot"}
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
	if id, err := hex.DecodeString(s.ID); err != nil || len(id) != idSize {
		return fmt.Errorf("%w: seal id %q", ErrCorrupt, s.ID)
	}
	if s.AEAD != sealAEAD || s.KDF != sealKDF || s.Wrap != sealWrap {
		return fmt.Errorf("%w: seal %s/%s/%s, this build reads %s/%s/%s", ErrVersion, s.AEAD, s.KDF, s.Wrap, sealAEAD, sealKDF, sealWrap)
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
// wrapped for each of Recipients.
type SealOptions struct {
	Recipients []age.Recipient
	// Names are the recipients as the manifest records them ("for
	// whom"), one per recipient.
	Names []string
	// whole seals every block whole, as before sealed windows (the
	// tests of older snapshots).
	whole bool
}

// ParseRecipients turns the arguments of dump --encrypt-to into
// SealOptions. Each is an age recipient (age1...), or a file holding
// recipients one a line, or an age identity file (AGE-SECRET-KEY-1...),
// whose recipients are used: one key file then both seals and opens
// snapshots.
func ParseRecipients(args []string) (*SealOptions, error) {
	o := &SealOptions{}
	for _, a := range args {
		var rs []age.Recipient
		if strings.HasPrefix(a, "age1") {
			r, err := age.ParseRecipients(strings.NewReader(a))
			if err != nil {
				return nil, fmt.Errorf("recipient %q: %w", a, err)
			}
			rs = r
		} else {
			b, err := readKeyFile(a, "recipient file")
			if err != nil {
				return nil, err
			}
			rs, err = age.ParseRecipients(bytes.NewReader(b))
			if err != nil {
				ids, ierr := age.ParseIdentities(bytes.NewReader(b))
				if ierr != nil {
					return nil, fmt.Errorf("recipient file %s: neither recipients (%v) nor identities (%v)", a, err, ierr)
				}
				rs = nil
				for _, id := range ids {
					switch id := id.(type) {
					case *age.X25519Identity:
						rs = append(rs, id.Recipient())
					case *age.HybridIdentity:
						rs = append(rs, id.Recipient())
					default:
						return nil, fmt.Errorf("recipient file %s: an identity of type %T has no recipient", a, id)
					}
				}
			}
		}
		for _, r := range rs {
			s, ok := r.(fmt.Stringer)
			if !ok {
				return nil, fmt.Errorf("recipient %s: type %T cannot be named", a, r)
			}
			o.Recipients = append(o.Recipients, r)
			o.Names = append(o.Names, s.String())
		}
	}
	if len(o.Recipients) == 0 {
		return nil, errors.New("no recipient")
	}
	return o, nil
}

// Keyring holds the identities a reader opens sealed snapshots with.
type Keyring struct {
	ids     []age.Identity
	signers []ed25519.PublicKey
	files   []string
}

// IdentityEnv names the environment variable that gives identity files
// (colon-separated) when no --identity is given.
const IdentityEnv = "LAZYFS_IDENTITY"

// LoadKeyring reads identity files: age identities (age-keygen's), which
// open sealed snapshots, or OpenSSH ed25519 public keys (KEY.pub, one a
// line), which verify signed ones. No file gives nil.
func LoadKeyring(files []string) (*Keyring, error) {
	if len(files) == 0 {
		return nil, nil
	}
	k := &Keyring{}
	for _, name := range files {
		b, err := readKeyFile(name, "identity")
		if err != nil {
			return nil, err
		}
		ids, err := age.ParseIdentities(bufio.NewReader(bytes.NewReader(b)))
		if err != nil {
			keys, serr := parseSignerKeys(b)
			if serr != nil {
				return nil, fmt.Errorf("identity file %s: neither age identities (%v) nor ssh-ed25519 public keys (%v)", name, err, serr)
			}
			k.signers = append(k.signers, keys...)
		}
		k.ids = append(k.ids, ids...)
		k.files = append(k.files, name)
	}
	return k, nil
}

// readKeyFile reads a file of keys (what names its use: identity,
// recipient file, signing key) that only the caller and root can change:
// a key another user could swap would be theirs (a public key verifying
// what they signed, a recipient reading what is sealed), as OpenSSH's
// StrictModes holds. It must be a regular file; a FIFO in its place is
// refused, not waited on (O_NONBLOCK).
func readKeyFile(name, what string) ([]byte, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%w: %s %s is not a regular file", ErrUntrusted, what, name)
	}
	if euid := uint32(os.Geteuid()); st.Uid != 0 && st.Uid != euid {
		return nil, fmt.Errorf("%w: %s %s belongs to uid %d, neither the caller (uid %d) nor root", ErrUntrusted, what, name, st.Uid, euid)
	}
	if st.Mode&0o022 != 0 {
		return nil, fmt.Errorf("%w: %s %s is writable by group or others (mode %04o): chmod go-w it", ErrUntrusted, what, name, st.Mode&0o7777)
	}
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, name, err)
	}
	return b, nil
}

// Files returns the identity files the keyring was read from.
func (k *Keyring) Files() []string {
	if k == nil {
		return nil
	}
	return k.files
}

// sealKeys are the keys of one opened or written sealed snapshot, all
// derived from its data key.
type sealKeys struct {
	id       [idSize]byte
	manifest []byte      // HMAC-SHA256 key of snapshot.json
	files    cipher.AEAD // sealed files
	data     []byte      // the data key, for the per-process page keys
}

// derive returns a key of the snapshot for purpose info.
func derive(data []byte, id [idSize]byte, info string) []byte {
	k, err := hkdf.Key(sha256.New, data, id[:], "lazyfs "+info, keySize)
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

func newSealKeys(data []byte, id [idSize]byte) *sealKeys {
	return &sealKeys{id: id, data: data,
		manifest: derive(data, id, "manifest mac"),
		files:    newGCM(derive(data, id, "sealed files"))}
}

// pagesAEAD returns the AEAD of the blocks of process pid.
func (k *sealKeys) pagesAEAD(pid int) cipher.AEAD {
	return newGCM(derive(k.data, k.id, fmt.Sprintf("pages %d", pid)))
}

// manifestMAC returns the MAC of the manifest bytes b.
func (k *sealKeys) manifestMAC(b []byte) []byte {
	h := hmac.New(sha256.New, k.manifest)
	h.Write(b)
	return h.Sum(nil)
}

// newDataKey returns a fresh data key and snapshot id.
func newDataKey() (data []byte, id [idSize]byte) {
	data = make([]byte, keySize)
	rand.Read(data)
	rand.Read(id[:])
	return data, id
}

// wrapKey returns keys.age: the id and data key, age-encrypted for the
// recipients.
func wrapKey(o *SealOptions, data []byte, id [idSize]byte) ([]byte, error) {
	var out bytes.Buffer
	w, err := age.Encrypt(&out, o.Recipients...)
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

// unwrapKey opens keys.age with the keyring's identities.
func unwrapKey(b []byte, k *Keyring) ([]byte, [idSize]byte, error) {
	var id [idSize]byte
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
	return p[len(keysMagic)+idSize:], id, nil
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
	id    [idSize]byte
	nonce [nonceSize]byte
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
	if body := uint64(len(b) - sealHeaderSize); body < tagSize || h.aux > body-tagSize {
		return nil, fmt.Errorf("%w: sealed file of %d bytes holds %d bytes of second part", ErrCorrupt, len(b), h.aux)
	}
	return h, nil
}

// sealFile returns the sealed file of plaintext (main part then aux
// bytes of second part).
func (k *sealKeys) sealFile(role uint16, pid int, plaintext []byte, aux int) []byte {
	h := sealHeader{role: role, pid: uint64(pid), id: k.id, aux: uint64(aux)}
	rand.Read(h.nonce[:])
	hdr := h.marshal()
	return k.files.Seal(hdr, h.nonce[:], plaintext, hdr)
}

// openFile authenticates and decrypts sealed file b, which must be of
// role and pid in this snapshot, and returns its two parts.
func (k *sealKeys) openFile(name string, b []byte, role uint16, pid int) ([]byte, []byte, error) {
	h, err := parseSealHeader(b)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	if h.role != role || h.pid != uint64(pid) || h.id != k.id {
		return nil, nil, fmt.Errorf("%s: %w: sealed for another file, process or snapshot", name, ErrAuth)
	}
	pt, err := k.files.Open(nil, h.nonce[:], b[sealHeaderSize:], b[:sealHeaderSize])
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
