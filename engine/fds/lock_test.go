package fds

import (
	"errors"
	"reflect"
	"testing"

	"github.com/lazyfs/lazyfs/engine/image"
)

// TestParseLocks: fdinfo's lock lines of each kind, as the kernel prints
// them; a lease is refused as unsupported, a line cut short as malformed.
func TestParseLocks(t *testing.T) {
	got, err := parseLocks([]string{
		"1: FLOCK  ADVISORY  WRITE 1541 00:17:20 0 EOF",
		"2: POSIX  ADVISORY  WRITE 1541 00:17:21 100 199",
		"3: OFDLCK ADVISORY  READ  -1 00:17:22 0 EOF",
	})
	want := []image.Lock{
		{Kind: image.LockFlock, Write: true, Start: 0, End: -1},
		{Kind: image.LockPOSIX, Write: true, Start: 100, End: 199},
		{Kind: image.LockOFD, Start: 0, End: -1},
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("parseLocks: %+v, %v; want %+v", got, err, want)
	}
	if _, err := parseLocks([]string{"1: LEASE  ACTIVE    READ  1541 00:17:20 0 EOF"}); !errors.Is(err, image.ErrUnsupported) {
		t.Errorf("a lease: %v, want ErrUnsupported", err)
	}
	for _, bad := range []string{"1: FLOCK  ADVISORY  WRITE 1541", "1: POSIX  ADVISORY  WRITE 1 0:0:1 9 3", "1: POSIX  ADVISORY  NONE 1 0:0:1 0 EOF"} {
		if _, err := parseLocks([]string{bad}); err == nil || errors.Is(err, image.ErrUnsupported) {
			t.Errorf("%q: %v, want an error of format", bad, err)
		}
	}
}
