package image

import (
	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
)

// KindStats are the figures of the blocks of one kind.
type KindStats struct {
	Blocks uint64 `json:"blocks"`
	Bytes  uint64 `json:"bytes"`  // decoded
	Stored uint64 `json:"stored"` // payload bytes (without RAW alignment padding)
}

// Stats are the figures of a page image.
type Stats struct {
	Zero KindStats `json:"zero"`
	Raw  KindStats `json:"raw"`
	LZ4  KindStats `json:"lz4"`
	// Shuffle blocks: byte-shuffled planes (codec.Shuffle).
	Shuffle KindStats `json:"shuffle,omitzero"`
	// Parent blocks of an incremental snapshot: the parent's, nothing
	// stored here (codec.Parent).
	Parent KindStats `json:"parent,omitzero"`
	// Forked blocks of a tree's child: its parent's, nothing stored here
	// (codec.Forked).
	Forked KindStats `json:"forked,omitzero"`
	Total  KindStats `json:"total"`
	Runs   int       `json:"runs"`
	// FileSize is the size of the pages file, padding included.
	FileSize uint64 `json:"file_size"`
}

// Ratio returns stored bytes over original bytes (0 for an empty image).
func (s Stats) Ratio() float64 {
	if s.Total.Bytes == 0 {
		return 0
	}
	return float64(s.FileSize) / float64(s.Total.Bytes)
}

func newStats(k [codec.NumKinds]KindStats) Stats {
	s := Stats{Zero: k[codec.Zero], Raw: k[codec.Raw], LZ4: k[codec.LZ4], Shuffle: k[codec.Shuffle], Parent: k[codec.Parent], Forked: k[codec.Forked]}
	for _, x := range k {
		s.Total.Blocks += x.Blocks
		s.Total.Bytes += x.Bytes
		s.Total.Stored += x.Stored
	}
	s.FileSize = s.Total.Stored
	return s
}

// runningKernel returns the release and machine of the running kernel.
func runningKernel() Kernel {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return Kernel{}
	}
	return Kernel{Release: unix.ByteSliceToString(u.Release[:]), Machine: unix.ByteSliceToString(u.Machine[:])}
}
