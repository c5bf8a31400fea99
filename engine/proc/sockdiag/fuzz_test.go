package sockdiag

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
)

// FuzzParseDiag is seeded with requests and sample replies (and the files
// in testdata/fuzz/FuzzParseDiag/); beyond not panicking, it checks that an
// error is a netlink errno or wraps proc.ErrMalformed or proc.ErrTooLarge,
// and that accepted output keeps the parser's bounds.
func FuzzParseDiag(f *testing.F) {
	f.Add(inetDiagRequest(unix.AF_INET, unix.IPPROTO_TCP, 1))
	f.Add(unixDiagRequest(1))
	f.Add(sampleInetDiagReply())
	f.Add(sampleUnixDiagReply())
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, err := ParseInetDiag(b, unix.IPPROTO_TCP, nil)
		if err != nil && !errors.Is(err, proc.ErrMalformed) && !errors.Is(err, proc.ErrTooLarge) {
			var errno unix.Errno
			if !errors.As(err, &errno) {
				t.Fatalf("inet: %v", err)
			}
		}
		us, _, err := ParseUnixDiag(b, nil)
		if err != nil && !errors.Is(err, proc.ErrMalformed) && !errors.Is(err, proc.ErrTooLarge) {
			var errno unix.Errno
			if !errors.As(err, &errno) {
				t.Fatalf("unix: %v", err)
			}
		}
		for _, u := range us {
			if len(u.Pending) > maxPendingPerSock {
				t.Fatalf("%d pending", len(u.Pending))
			}
		}
	})
}
