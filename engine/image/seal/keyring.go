package seal

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"filippo.io/age"
	"golang.org/x/sys/unix"
)

// ParseRecipients turns the arguments of dump --encrypt-to into the
// recipients a snapshot is sealed for, and their names as the manifest
// records them ("for whom"), one per recipient. Each argument is an age
// recipient (age1...), or a file holding recipients one a line, or an age
// identity file (AGE-SECRET-KEY-1...), whose recipients are used: one key
// file then both seals and opens snapshots.
func ParseRecipients(args []string) ([]age.Recipient, []string, error) {
	var recipients []age.Recipient
	var names []string
	for _, a := range args {
		var rs []age.Recipient
		if strings.HasPrefix(a, "age1") {
			r, err := age.ParseRecipients(strings.NewReader(a))
			if err != nil {
				return nil, nil, fmt.Errorf("recipient %q: %w", a, err)
			}
			rs = r
		} else {
			b, err := readKeyFile(a, "recipient file")
			if err != nil {
				return nil, nil, err
			}
			if rs, err = recipientsOf(a, b); err != nil {
				return nil, nil, err
			}
		}
		for _, r := range rs {
			s, ok := r.(fmt.Stringer)
			if !ok {
				return nil, nil, fmt.Errorf("recipient %s: type %T cannot be named", a, r)
			}
			recipients = append(recipients, r)
			names = append(names, s.String())
		}
	}
	if len(recipients) == 0 {
		return nil, nil, errors.New("no recipient")
	}
	return recipients, names, nil
}

// recipientsOf returns the recipients of file name, b: recipients one a
// line, or the recipients of the identities it holds.
func recipientsOf(name string, b []byte) ([]age.Recipient, error) {
	rs, err := age.ParseRecipients(bytes.NewReader(b))
	if err == nil {
		return rs, nil
	}
	ids, ierr := age.ParseIdentities(bytes.NewReader(b))
	if ierr != nil {
		return nil, fmt.Errorf("recipient file %s: neither recipients (%v) nor identities (%v)", name, err, ierr)
	}
	rs = nil
	for _, id := range ids {
		switch id := id.(type) {
		case *age.X25519Identity:
			rs = append(rs, id.Recipient())
		case *age.HybridIdentity:
			rs = append(rs, id.Recipient())
		default:
			return nil, fmt.Errorf("recipient file %s: an identity of type %T has no recipient", name, id)
		}
	}
	return rs, nil
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

// HasIdentities reports whether the keyring holds age identities (that
// open sealed snapshots).
func (k *Keyring) HasIdentities() bool { return len(k.ids) > 0 }

// HasSigners reports whether the keyring holds signers' public keys
// (that verify signed snapshots).
func (k *Keyring) HasSigners() bool { return len(k.signers) > 0 }

// Verify reports whether sig is a signature of msg by one of the
// keyring's signers.
func (k *Keyring) Verify(msg, sig []byte) bool {
	for _, pub := range k.signers {
		if ed25519.Verify(pub, msg, sig) {
			return true
		}
	}
	return false
}
