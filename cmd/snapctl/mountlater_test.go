package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/fs"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// TestMountLaterFails: a private mount that cannot be made leaves the
// lazy restore of one process reading the snapshot's files (its source
// never up, nothing said on gone, a warning naming the failure), while a
// process tree's restore, which waits for its mount, is told on gone.
func TestMountLaterFails(t *testing.T) {
	failed := errors.New("no FUSE here")
	mount := func() (*fs.PrivateMount, error) { return nil, failed }

	logged := &testutil.Buffer{}
	one := mountLater(mount, false, slog.New(slog.NewTextHandler(logged, nil)))
	if err := one.ready(context.Background()); !errors.Is(err, failed) {
		t.Fatalf("ready: %v, want the mount's error", err)
	}
	if one.up() {
		t.Error("a mount that failed reports itself up")
	}
	select {
	case err := <-one.gone:
		t.Errorf("one process: gone said %v; the restore should go on without the mount", err)
	case <-time.After(100 * time.Millisecond):
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logged.String(), failed.Error()); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no warning naming the failure: %q", logged.String())
		}
	}
	if err := one.close(); err != nil {
		t.Errorf("close: %v", err)
	}

	tree := mountLater(mount, true, slog.New(slog.DiscardHandler))
	select {
	case err := <-tree.gone:
		if !errors.Is(err, failed) {
			t.Errorf("tree: gone said %v, want the mount's error", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("tree: gone said nothing of a mount that failed")
	}
	if tree.up != nil {
		t.Error("a tree's source claims it can be read before its mount is up")
	}
	tree.close()
}

// TestMountLaterInterrupted: a tree's restore waiting for a private mount
// that is slow to come up (a store that stalls) returns as soon as its
// context ends (SIGINT, SIGTERM), and closing the source then does not
// wait for the mount either.
func TestMountLaterInterrupted(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	mount := func() (*fs.PrivateMount, error) {
		<-release
		return nil, errors.New("released")
	}
	tree := mountLater(mount, true, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	if err := tree.ready(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("ready: %v, want the context's end", err)
	}
	done := make(chan struct{})
	go func() {
		tree.close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("close waited for a mount still being set up after a signal")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("ready and close took %v after the context ended", took)
	}
}
