package s3store_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/s3store"
)

// TestLeftoversOfOtherHosts: a lock whose dump ran on another host, or an
// older lock that says nothing of its dump, may belong to a dump that
// runs: a dump there is refused saying so and how to clear it, cleanup
// refuses it without --force and clears the lock and the dump's objects
// with it. Objects no lock marks as a dump's are listed, never removed.
func TestLeftoversOfOtherHosts(t *testing.T) {
	m, o, _ := setup(t)
	ctx := context.Background()
	put := func(key, body string) {
		t.Helper()
		if _, err := m.Client().PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("snaps"), Key: aws.String(key), Body: bytes.NewReader([]byte(body))}); err != nil {
			t.Fatal(err)
		}
	}
	keys := func(prefix string) []string {
		t.Helper()
		out, err := m.Client().ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("snaps"), Prefix: aws.String(prefix)})
		if err != nil {
			t.Fatal(err)
		}
		var ks []string
		for _, c := range out.Contents {
			ks = append(ks, aws.ToString(c.Key))
		}
		return ks
	}

	for _, tc := range []struct{ name, lock, says string }{
		{"other-host", "lazyfs dump lock\nhost: elsewhere\nboot_id: 0\npid: 4242\nstart_ticks: 7\nstarted: 2026-01-02T03:04:05Z\n", "the dump of pid 4242 on host elsewhere, started 2026-01-02T03:04:05Z"},
		{"older", "dump in progress\n", "a dump of an older lazyfs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := "dead-" + tc.name + "/"
			addr := "s3://snaps/" + strings.TrimSuffix(prefix, "/")
			put(prefix+".lazyfs-dump.lock", tc.lock)
			put(prefix+"pages-4242.img", "partial")

			_, err := s3store.Create(addr, o)
			if !errors.Is(err, image.ErrLocked) || !strings.Contains(err.Error(), tc.says) ||
				!strings.Contains(err.Error(), "snapctl cleanup --force -D "+addr) {
				t.Errorf("dump into the prefix: %v; want locked, naming %q and cleanup --force", err, tc.says)
			}

			l, err := s3store.FindLeftovers(ctx, addr, o)
			if err != nil {
				t.Fatal(err)
			}
			if l.Lock == nil || l.Complete || len(l.Objects) != 1 || l.Objects[0].Name != "pages-4242.img" {
				t.Fatalf("leftovers %+v: want the lock and pages-4242.img", l)
			}
			if s := l.Lock.Describe(); !strings.Contains(s, tc.says) || !strings.HasSuffix(s, "(unknown)") {
				t.Errorf("lock described as %q", s)
			}
			err = l.Clear(ctx, false, func(string) {})
			if !errors.Is(err, s3store.ErrLockHeld) || !strings.Contains(err.Error(), "--force") {
				t.Errorf("clear without force: %v, want ErrLockHeld naming --force", err)
			}
			if got := keys(prefix); len(got) != 2 {
				t.Errorf("after a refused clear: %v, want both objects kept", got)
			}
			var did []string
			if err := l.Clear(ctx, true, func(s string) { did = append(did, s) }); err != nil {
				t.Fatal(err)
			}
			if got := keys(prefix); len(got) != 0 {
				t.Errorf("after clear --force: %v, want nothing (did %q)", got, did)
			}
		})
	}

	t.Run("not a dump's", func(t *testing.T) {
		put("other/notes.txt", "mine")
		l, err := s3store.FindLeftovers(ctx, "s3://snaps/other", o)
		if err != nil {
			t.Fatal(err)
		}
		if !l.Empty() || len(l.Others) != 1 || l.Others[0].Name != "notes.txt" {
			t.Fatalf("leftovers %+v: want nothing to clear, notes.txt listed as another's", l)
		}
		if err := l.Clear(ctx, true, func(string) {}); err != nil {
			t.Fatal(err)
		}
		if got := keys("other/"); !slices.Equal(got, []string{"other/notes.txt"}) {
			t.Errorf("after clear: %v, want notes.txt kept", got)
		}
	})
}
