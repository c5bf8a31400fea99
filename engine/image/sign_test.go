package image

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"
	"golang.org/x/crypto/ssh"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image/seal"
)

// signingKey writes an OpenSSH ed25519 key pair (ssh-keygen's files) and
// returns the private key file and the public one.
func signingKey(t *testing.T) (string, string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	blk, err := ssh.MarshalPrivateKey(priv, "test")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	key, pubFile := filepath.Join(dir, "sign"), filepath.Join(dir, "sign.pub")
	os.WriteFile(key, pem.EncodeToMemory(blk), 0o600)
	os.WriteFile(pubFile, []byte(seal.SignerKeyLine(pub)+" test\n"), 0o644)
	return key, pubFile
}

func keyring(t *testing.T, files ...string) *seal.Keyring {
	t.Helper()
	k, err := seal.LoadKeyring(files)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestSigned(t *testing.T) {
	key, pub := signingKey(t)
	_, otherPub := signingKey(t)
	priv, err := seal.ParseSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	writeSnapshot(t, dir, 42, layoutRanges(5), Options{BlockSize: 64 << 10, Sign: priv})
	if err := readSnapshot(dir, keyring(t, pub)); err != nil {
		t.Fatal(err)
	}
	s, _ := OpenWith(dir, OpenOptions{Keys: keyring(t, pub)})
	if !s.Signed() || s.Sealed() || s.Manifest.Signature == nil || !strings.HasPrefix(s.Manifest.Signature.Key, "ssh-ed25519 ") {
		t.Fatalf("signed %v sealed %v %+v", s.Signed(), s.Sealed(), s.Manifest.Signature)
	}
	e := s.Manifest.Processes[0]
	r, _ := s.OpenPages(42, ReaderOptions{})
	var stored []Block
	for b := range r.Blocks() {
		if b.Kind != codec.Zero {
			stored = append(stored, b)
		}
	}
	r.Close()
	s.Close()
	if _, err := Open(dir); !errors.Is(err, ErrNoIdentity) || !strings.Contains(err.Error(), "signed by ssh-ed25519") {
		t.Fatalf("no key: %v", err)
	}
	if err := readSnapshot(dir, keyring(t, otherPub)); !errors.Is(err, ErrAuth) {
		t.Fatalf("another key: %v", err)
	}
	// A signer's key for a snapshot that is not signed.
	plain := filepath.Join(t.TempDir(), "plain")
	writeSnapshot(t, plain, 42, layoutRanges(2), Options{})
	if err := readSnapshot(plain, keyring(t, pub)); !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("unsigned with a key: %v", err)
	}
	flip := func(name string, off int64) func(string) {
		return func(d string) {
			p := filepath.Join(d, name)
			b, _ := os.ReadFile(p)
			if off < 0 {
				off += int64(len(b))
			}
			b[off] ^= 0x01
			os.WriteFile(p, b, 0o600)
		}
	}
	a, b := stored[1], stored[2]
	for _, tc := range []struct {
		name   string
		change func(string)
		names  string
	}{
		{"block", flip(e.Pages, int64(stored[len(stored)/2].Off)+9), e.Pages},
		{"digests", flip(e.Digests, 40), e.Digests},
		{"index", flip(e.Index, 70), e.Index},
		{"state", flip(e.State, 5), e.State},
		{"manifest", flip(ManifestName, 50), ManifestName},
		{"signature", flip(AuthName, 60), ManifestName},
		{"block moved", func(d string) {
			p := filepath.Join(d, e.Pages)
			buf, _ := os.ReadFile(p)
			n := min(a.StoredLen, b.StoredLen)
			copy(buf[b.Off:b.Off+uint64(n)], buf[a.Off:a.Off+uint64(n)])
			os.WriteFile(p, buf, 0o600)
		}, e.Pages},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := copyDir(t, dir)
			tc.change(d)
			err := readSnapshot(d, keyring(t, pub))
			if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("got %v, want an authentication failure naming %s", err, tc.names)
			}
		})
	}
}

// TestSealedAndSigned: a snapshot both sealed and signed opens with the
// identity alone, with the identity and the signer's key, not with the
// signer's key alone (its memory is encrypted); a keyring holding a
// signer's key refuses a snapshot that is only sealed.
func TestSealedAndSigned(t *testing.T) {
	key, pub := signingKey(t)
	priv, _ := seal.ParseSigner(key)
	id, _ := age.GenerateX25519Identity()
	idFile := filepath.Join(t.TempDir(), "id.txt")
	os.WriteFile(idFile, []byte(id.String()+"\n"), 0o600)
	so, _ := sealOptions([]string{idFile})
	dir := filepath.Join(t.TempDir(), "snap")
	writeSnapshot(t, dir, 42, layoutRanges(6), Options{Seal: so, Sign: priv})
	if err := readSnapshot(dir, keyring(t, idFile)); err != nil {
		t.Fatal(err)
	}
	if err := readSnapshot(dir, keyring(t, idFile, pub)); err != nil {
		t.Fatal(err)
	}
	if err := readSnapshot(dir, keyring(t, pub)); !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("signer's key alone: %v", err)
	}
	d := copyDir(t, dir)
	b, _ := os.ReadFile(filepath.Join(d, KeysName))
	b[len(b)-3] ^= 1
	os.WriteFile(filepath.Join(d, KeysName), b, 0o600)
	if err := readSnapshot(d, keyring(t, idFile, pub)); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("keys.age changed: %v", err)
	}
	sealedOnly := filepath.Join(t.TempDir(), "sealed")
	writeSnapshot(t, sealedOnly, 42, layoutRanges(6), Options{Seal: so})
	if err := readSnapshot(sealedOnly, keyring(t, idFile, pub)); !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("sealed only, with a signer's key: %v", err)
	}
}
