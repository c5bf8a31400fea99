//go:build race

package fs

// raceEnabled shrinks the large tests under the race detector, which
// slows decoding several times.
const raceEnabled = true
