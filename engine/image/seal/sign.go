package seal

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/ssh"
)

// The algorithms of a signed snapshot, as its manifest names them, and
// the size of a block's or a file's digest.
const (
	SignAlg    = "ed25519"
	SignDigest = "SHA-256"
	DigestSize = sha256.Size
)

// ParseSigner reads the private key of dump --sign: an OpenSSH ed25519
// key file without a passphrase.
func ParseSigner(file string) (ed25519.PrivateKey, error) {
	b, err := readKeyFile(file, "signing key")
	if err != nil {
		return nil, err
	}
	k, err := ssh.ParseRawPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", file, err)
	}
	switch k := k.(type) {
	case *ed25519.PrivateKey:
		return *k, nil
	case ed25519.PrivateKey:
		return k, nil
	}
	return nil, fmt.Errorf("signing key %s: a %T, not an ed25519 key", file, k)
}

// parseSignerKeys reads ssh-ed25519 public keys, one a line (comments and
// blank lines skipped).
func parseSignerKeys(b []byte) ([]ed25519.PublicKey, error) {
	var out []ed25519.PublicKey
	for len(bytes.TrimSpace(b)) > 0 {
		pk, _, _, rest, err := ssh.ParseAuthorizedKey(b)
		if err != nil {
			return nil, err
		}
		b = rest
		ck, ok := pk.(ssh.CryptoPublicKey)
		if !ok {
			return nil, fmt.Errorf("a %s key, not ssh-ed25519", pk.Type())
		}
		ek, ok := ck.CryptoPublicKey().(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("a %s key, not ssh-ed25519", pk.Type())
		}
		out = append(out, ek)
	}
	if len(out) == 0 {
		return nil, errors.New("no key")
	}
	return out, nil
}

// SignerKeyLine returns the authorized_keys line of a public key.
func SignerKeyLine(pub ed25519.PublicKey) string {
	pk, err := ssh.NewPublicKey(pub)
	if err != nil {
		panic(err) // an ed25519 key always converts
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pk)))
}

// AppendDigest appends the SHA-256 of a block's stored bytes to buf: a
// signed snapshot's block digest, computed at dump time.
func AppendDigest(buf, stored []byte) []byte {
	sum := sha256.Sum256(stored)
	return append(buf, sum[:]...)
}
