package s3_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/store/s3"
	"github.com/lazyfs/lazyfs/test/fixture"
)

// TestLeftoversOfOtherHosts: a lock whose dump ran on another host, or an
// older lock that says nothing of its dump, may belong to a dump that
// runs: a dump there is refused saying so and how to clear it, cleanup
// refuses it without --force and clears the lock and the dump's objects
// with it. Objects no lock marks as a dump's are listed, never removed.
func TestLeftoversOfOtherHosts(t *testing.T) {
	m, o, _ := setup(t)
	ctx := context.Background()
	put := func(key, body string) { putObject(t, m, key, body) }
	keys := func(prefix string) []string {
		t.Helper()
		out, err := m.Client().ListObjectsV2(ctx, &awss3.ListObjectsV2Input{Bucket: aws.String("snaps"), Prefix: aws.String(prefix)})
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

			_, err := s3.Create(addr, o)
			if !errors.Is(err, image.ErrLocked) || !strings.Contains(err.Error(), tc.says) ||
				!strings.Contains(err.Error(), "snapctl cleanup --force -D "+addr) {
				t.Errorf("dump into the prefix: %v; want locked, naming %q and cleanup --force", err, tc.says)
			}

			l, err := s3.FindLeftovers(ctx, addr, o)
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
			if !errors.Is(err, s3.ErrLockHeld) || !strings.Contains(err.Error(), "--force") {
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
		l, err := s3.FindLeftovers(ctx, "s3://snaps/other", o)
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

// TestLeftoversChangedOrStale: a lock replaced between listing and
// clearing (another dump took the prefix) is not cleared; a marker whose
// upload is gone (a complete snapshot whose marker's delete failed) is
// removed with nothing aborted; an upload no marker or lock names (another
// tool's) is never aborted.
func TestLeftoversChangedOrStale(t *testing.T) {
	m, o, _ := setup(t)
	ctx := context.Background()
	put := func(key, body string) { putObject(t, m, key, body) }
	other := "lazyfs dump lock\nhost: elsewhere\nboot_id: 0\npid_ns: pid:[1]\npid: 1\nstart_ticks: 1\nstarted: 2026-01-02T03:04:05Z\n"

	put("changed/.lazyfs-dump.lock", other)
	l, err := s3.FindLeftovers(ctx, "s3://snaps/changed", o)
	if err != nil {
		t.Fatal(err)
	}
	put("changed/.lazyfs-dump.lock", strings.Replace(other, "pid: 1\n", "pid: 2\n", 1))
	if err := l.Clear(ctx, true, func(string) {}); !errors.Is(err, s3.ErrLockHeld) || !strings.Contains(err.Error(), "since it was listed") {
		t.Errorf("clear after the lock changed: %v, want ErrLockHeld", err)
	}

	put("stale/"+image.ManifestName, "{}")
	put("stale/.lazyfs-upload.pages-1.img", "no-such-upload-id\n")
	up, err := m.Client().CreateMultipartUpload(ctx, &awss3.CreateMultipartUploadInput{Bucket: aws.String("snaps"), Key: aws.String("stale/notes.bin")})
	if err != nil {
		t.Fatal(err)
	}
	l, err = s3.FindLeftovers(ctx, "s3://snaps/stale", o)
	if err != nil {
		t.Fatal(err)
	}
	if !l.Complete || len(l.Markers) != 1 || len(l.Stale) != 1 || len(l.Uploads) != 0 {
		t.Fatalf("leftovers %+v: want a complete snapshot, one stale marker, no upload to abort", l)
	}
	var did []string
	if err := l.Clear(ctx, false, func(s string) { did = append(did, s) }); err != nil {
		t.Fatal(err)
	}
	if len(did) != 0 {
		t.Errorf("clearing a stale marker reported %q", did)
	}
	out, err := m.Client().ListObjectsV2(ctx, &awss3.ListObjectsV2Input{Bucket: aws.String("snaps"), Prefix: aws.String("stale/")})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Contents) != 1 || aws.ToString(out.Contents[0].Key) != "stale/"+image.ManifestName {
		t.Errorf("after clear: %d objects, want the manifest alone", len(out.Contents))
	}
	ups, err := m.Client().ListMultipartUploads(ctx, &awss3.ListMultipartUploadsInput{Bucket: aws.String("snaps"), Prefix: aws.String("stale/notes.bin")})
	if err != nil {
		t.Fatal(err)
	}
	if len(ups.Uploads) != 1 || aws.ToString(ups.Uploads[0].UploadId) != aws.ToString(up.UploadId) {
		t.Errorf("another tool's upload was aborted: %d left", len(ups.Uploads))
	}
}

// TestLockState: a lock is running only when its pid, with the same start
// time, is in the caller's own pid namespace of the same boot of the same
// host; another pid namespace (a container on the host) cannot tell.
func TestLockState(t *testing.T) {
	me := s3.OurLockForTest()
	if st := me.State(); st != s3.LockRunning {
		t.Errorf("our own lock: %v, want running", st)
	}
	ns := me
	ns.PIDNS = "pid:[1]"
	if st := ns.State(); st != s3.LockUnknown {
		t.Errorf("a lock of another pid namespace: %v, want unknown", st)
	}
	gone := me
	gone.Start++
	if st := gone.State(); st != s3.LockGone {
		t.Errorf("a lock whose pid has another start time: %v, want gone", st)
	}
	reboot := me
	reboot.BootID = "another-boot"
	if st := reboot.State(); st != s3.LockGone {
		t.Errorf("a lock of another boot: %v, want gone", st)
	}
}

// putObject stores body as key in the bucket "snaps", as another tool
// would.
func putObject(t *testing.T, m *fixture.MinIO, key, body string) {
	t.Helper()
	if _, err := m.Client().PutObject(context.Background(), &awss3.PutObjectInput{Bucket: aws.String("snaps"), Key: aws.String(key), Body: bytes.NewReader([]byte(body))}); err != nil {
		t.Fatal(err)
	}
}
