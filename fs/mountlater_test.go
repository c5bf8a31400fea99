package fs

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/test/testutil"
)

// TestMountLaterFails: a private mount that cannot be made leaves the
// lazy restore reading the snapshot's files: the source never up,
// nothing said on Gone (the restore goes on), a warning naming the
// failure.
func TestMountLaterFails(t *testing.T) {
	failed := errors.New("no FUSE here")
	logged := &testutil.Buffer{}
	s := mountLater(func() (*PrivateMount, error) { return nil, failed }, slog.New(slog.NewTextHandler(logged, nil)))
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logged.String(), failed.Error()); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no warning naming the failure: %q", logged.String())
		}
	}
	if s.up() {
		t.Error("a mount that failed reports itself up")
	}
	select {
	case err := <-s.Gone():
		t.Errorf("Gone said %v; the restore should go on without the mount", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestMountLaterAborted: a restore ending on a signal (Abort) while its
// private mount is slow to come up (a store that stalls) does not wait
// for the mount when it closes the source.
func TestMountLaterAborted(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	s := mountLater(func() (*PrivateMount, error) {
		<-release
		return nil, errors.New("released")
	}, slog.New(slog.DiscardHandler))
	s.Abort()
	done := make(chan struct{})
	go func() {
		s.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for a mount still being set up after Abort")
	}
}
