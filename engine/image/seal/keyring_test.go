package seal

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"filippo.io/age"
)

// TestIdentityFileTrust: an identity file, a recipient file or a signing
// key that a user other than the caller and root can change is refused,
// naming it, before it is read: a public key swapped in would verify what
// that user signed, a recipient would read what is sealed.
func TestIdentityFileTrust(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	dir := t.TempDir()
	f := filepath.Join(dir, "id.txt")
	if err := os.WriteFile(f, []byte(id.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKeyring([]string{f}); err != nil {
		t.Fatalf("the caller's own identity: %v", err)
	}
	if err := os.Chmod(f, 0o620); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKeyring([]string{f}); !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "writable by group or others") {
		t.Errorf("a group-writable identity: %v, want ErrUntrusted", err)
	}
	if err := os.Chmod(f, 0o600); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(f, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadKeyring([]string{f}); !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "belongs to uid 65534") {
			t.Errorf("another user's identity: %v, want ErrUntrusted", err)
		}
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// A recipient file (dump --encrypt-to) and a signing key (--sign)
	// are held to the same: a recipient swapped in would read the
	// snapshot.
	loose := filepath.Join(dir, "recipients.txt")
	if err := os.WriteFile(loose, []byte(id.Recipient().String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ParseRecipients([]string{loose}); err != nil {
		t.Fatalf("the caller's own recipient file: %v", err)
	}
	if err := os.Chmod(loose, 0o602); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ParseRecipients([]string{loose}); !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "recipient file") {
		t.Errorf("a world-writable recipient file: %v, want ErrUntrusted", err)
	}
	if _, err := ParseSigner(loose); !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "signing key") {
		t.Errorf("a world-writable signing key: %v, want ErrUntrusted", err)
	}
	// No writer: a FIFO is refused, not waited on.
	if _, err := LoadKeyring([]string{fifo}); !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a FIFO as identity: %v, want ErrUntrusted", err)
	}
}
