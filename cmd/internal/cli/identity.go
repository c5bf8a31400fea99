package cli

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/lazyfs/lazyfs/engine/image/seal"
)

// Strings defines a repeatable string flag: each use adds a value.
func (f *FlagSet) Strings(name, usage string) *[]string {
	v := &stringList{}
	f.Var(v, name, usage)
	return &v.v
}

type stringList struct{ v []string }

func (s *stringList) String() string     { return strings.Join(s.v, ",") }
func (s *stringList) Set(v string) error { s.v = append(s.v, v); return nil }

// IdentityUsage is the help of --identity, the same for every reader.
const IdentityUsage = "open a sealed (encrypted) snapshot with the age identities in `FILE` (age-keygen's), or verify a signed one with the ssh-ed25519 public keys in it (KEY.pub); repeatable; default: the files of $" +
	seal.IdentityEnv + " (colon-separated). Every kind of key given must serve: with an age identity a snapshot that is not sealed is refused, with a public key one that is not signed by it"

// Identity defines --identity on f and returns a function that loads the
// keyring after parsing: the files given, else those of $LAZYFS_IDENTITY,
// else none (nil).
func (f *FlagSet) Identity() func() (*seal.Keyring, error) {
	files := f.Strings("identity", IdentityUsage)
	return func() (*seal.Keyring, error) {
		names := *files
		if len(names) == 0 {
			for _, n := range filepath.SplitList(os.Getenv(seal.IdentityEnv)) {
				if n != "" {
					names = append(names, n)
				}
			}
		}
		return seal.LoadKeyring(names)
	}
}
