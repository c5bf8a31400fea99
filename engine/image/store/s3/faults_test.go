package s3_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/image/store"
	"github.com/lazyfs/lazyfs/engine/image/store/s3"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// faultCase writes an object through MinIO and opens the store through a
// fault proxy, with o's read options.
func faultCase(t *testing.T, o store.Options) (*fixture.FaultProxy, store.File, []byte) {
	t.Helper()
	m, direct, _ := setup(t)
	data := make([]byte, 3<<20)
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rnd.Uint32())
	}
	addr := "s3://snaps/faults"
	write(t, addr, direct, map[string][]byte{"pages-1.img": data})
	p := fixture.StartFaultProxy(t, m.Endpoint)
	o.Endpoint = p.URL
	s, err := s3.Open(addr, o)
	if err != nil {
		t.Fatal(err)
	}
	f, err := s.Open("pages-1.img")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return p, f, data
}

// warnings captures slog's default logger's warnings for the test.
func warnings(t *testing.T) *testutil.Buffer {
	t.Helper()
	var buf testutil.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	t.Cleanup(func() { slog.SetDefault(old) })
	return &buf
}

// Three seconds of 503 SlowDown (what many replicas starting at once
// provoke) are waited out: the read succeeds, with the right bytes.
func TestReadRetriesSlowDown(t *testing.T) {
	p, f, data := faultCase(t, store.Options{})
	p.Set("503", 3*time.Second)
	start := time.Now()
	b := make([]byte, 64<<10)
	if _, err := f.ReadAt(b, 1<<20); err != nil {
		t.Fatalf("read through 3 s of 503: %v", err)
	}
	if !bytes.Equal(b, data[1<<20:1<<20+len(b)]) {
		t.Error("wrong bytes after the store recovered")
	}
	faulted := p.Faulted()
	t.Logf("read after %v, %d answers of 503", time.Since(start).Round(time.Millisecond), faulted)
	if faulted < 2 || time.Since(start) < 2*time.Second {
		t.Errorf("%d answers of 503 in %v: the fault did not happen", faulted, time.Since(start))
	}
}

// A store that stops answering (connections open, nothing said) is
// waited for up to the read timeout, with a warning every few seconds
// naming the object, then the read fails naming the store and the flag.
func TestReadStallBounded(t *testing.T) {
	logs := warnings(t)
	const timeout = 7 * time.Second
	p, f, _ := faultCase(t, store.Options{ReadTimeout: timeout})
	p.Set("stall", 0)
	start := time.Now()
	_, err := f.ReadAt(make([]byte, 4096), 0)
	took := time.Since(start)
	t.Logf("gave up after %v: %v", took.Round(time.Millisecond), err)
	if err == nil || !strings.Contains(err.Error(), p.URL) || !strings.Contains(err.Error(), "--s3-read-timeout") {
		t.Errorf("read of a stalled store: %v, want an error naming the endpoint and --s3-read-timeout", err)
	}
	if took < timeout-time.Second || took > timeout+3*time.Second {
		t.Errorf("gave up after %v, want about %v", took, timeout)
	}
	w := logs.String()
	if !strings.Contains(w, "level=WARN") || !strings.Contains(w, "pages-1.img") || !strings.Contains(w, "waiting=5s") {
		t.Errorf("no warning naming the object after 5 s:\n%s", w)
	}
}

// The command's context ends a read that waits on a stalled store at once
// (SIGINT and SIGTERM cancel it).
func TestReadStallCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, f, _ := faultCase(t, store.Options{Context: ctx})
	p.Set("stall", 0)
	done := make(chan error, 1)
	go func() {
		_, err := f.ReadAt(make([]byte, 4096), 2<<20)
		done <- err
	}()
	time.Sleep(time.Second)
	cancel()
	cancelled := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("read after cancel: %v, want context.Canceled", err)
		}
		if d := time.Since(cancelled); d > time.Second {
			t.Errorf("read returned %v after the cancel, want within 1 s", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a read waiting on a stalled store outlived its context by 10 s")
	}
}

// A store that ignores Range (200 with the whole object) is named as
// such, at once, not taken for a corrupt snapshot.
func TestReadRangeIgnored(t *testing.T) {
	p, f, _ := faultCase(t, store.Options{})
	p.Set("norange", 0)
	start := time.Now()
	_, err := f.ReadAt(make([]byte, 4096), 1<<20)
	if err == nil || !strings.Contains(err.Error(), "ignored the Range") {
		t.Errorf("read from a store that ignores Range: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v: an answer that will not change was retried", d)
	}
}
