package image

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/engine/codec"
)

// TestCorruptMatches: every way a snapshot can be damaged matches
// ErrCorrupt and its own sentinel; an incomplete snapshot, another format
// version and a block that could not be read do not.
func TestCorruptMatches(t *testing.T) {
	block := func(err error) error {
		return fmt.Errorf("fill: %w", &BlockError{File: "pages-1.img", Block: 3, Addr: 0x1000, Err: err})
	}
	for _, tc := range []struct {
		err     error
		own     error // the sentinel it also matches
		corrupt bool
	}{
		{fmt.Errorf("x: %w", ErrCorrupt), ErrCorrupt, true},
		{fmt.Errorf("x: %w", ErrBadMagic), ErrBadMagic, true},
		{fmt.Errorf("x: %w", ErrHeaderChecksum), ErrHeaderChecksum, true},
		{fmt.Errorf("x: %w", ErrTruncated), ErrTruncated, true},
		{fmt.Errorf("x: %w", ErrManifestMismatch), ErrManifestMismatch, true},
		{block(fmt.Errorf("%w: crc32c 1, want 2", codec.ErrChecksum)), codec.ErrChecksum, true},
		{block(fmt.Errorf("%w: lz4", codec.ErrUndecodable)), codec.ErrUndecodable, true},
		{block(io.ErrUnexpectedEOF), io.ErrUnexpectedEOF, false},
		{fmt.Errorf("x: %w", ErrIncomplete), ErrIncomplete, false},
		{fmt.Errorf("x: %w", ErrVersion), ErrVersion, false},
		{fmt.Errorf("x: %w", ErrExists), ErrExists, false},
	} {
		if !errors.Is(tc.err, tc.own) {
			t.Errorf("%v does not match its own sentinel %v", tc.err, tc.own)
		}
		if got := errors.Is(tc.err, ErrCorrupt); got != tc.corrupt {
			t.Errorf("errors.Is(%v, ErrCorrupt) = %v, want %v", tc.err, got, tc.corrupt)
		}
	}
	if errors.Is(ErrBadMagic, ErrTruncated) || errors.Is(ErrCorrupt, ErrBadMagic) {
		t.Error("the narrower sentinels match each other or ErrCorrupt matches them")
	}
}

func TestManifestFeatures(t *testing.T) {
	base := func(features string) []byte {
		return []byte(`{"format":"lazyfs-snapshot","version":1,"page_size":4096,"block_size":262144,` +
			`"processes":[{"pid":7,"state":"s","index":"i","pages":"p"}],` +
			`"files":{"s":{"size":1,"crc32c":"0"},"i":{"size":1,"crc32c":"0"},"p":{"size":1,"crc32c":"0"}}` + features + `}`)
	}
	if _, err := parseManifest(base("")); err != nil {
		t.Fatalf("no features: %v", err)
	}
	_, err := parseManifest(base(`,"features":["from-the-future"]`))
	if !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), `"from-the-future"`) {
		t.Fatalf("unknown feature: %v, want ErrVersion naming it", err)
	}
	knownFeatures["test-a"], knownFeatures["test-b"] = true, true
	t.Cleanup(func() { delete(knownFeatures, "test-a"); delete(knownFeatures, "test-b") })
	m, err := parseManifest(base(`,"features":["test-a","test-b"]`))
	if err != nil || !m.HasFeature("test-b") || m.HasFeature("test-c") {
		t.Fatalf("known features: %v %v", m, err)
	}
	if _, err := parseManifest(base(`,"features":["test-b","test-a"]`)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("unsorted features: %v, want ErrCorrupt", err)
	}
}
