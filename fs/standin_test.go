package fs

import (
	"bytes"
	"io"
	"sync/atomic"
	"testing"
)

// TestStandIn: until the source is up, reads go to the snapshot's own
// files; from then on, to the source.
func TestStandIn(t *testing.T) {
	var up atomic.Bool
	mount := bytes.NewReader(bytes.Repeat([]byte{'m'}, 64))
	direct := bytes.NewReader(bytes.Repeat([]byte{'d'}, 64))
	s := standIn{up: up.Load, src: mount, direct: direct}
	read := func() byte {
		t.Helper()
		b := make([]byte, 8)
		if _, err := s.ReadAt(b, 8); err != nil && err != io.EOF {
			t.Fatal(err)
		}
		return b[0]
	}
	if got := read(); got != 'd' {
		t.Errorf("before the source is up: read %q, want the files' %q", got, 'd')
	}
	up.Store(true)
	if got := read(); got != 'm' {
		t.Errorf("once the source is up: read %q, want the source's %q", got, 'm')
	}
}
