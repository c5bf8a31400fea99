//go:build !amd64

package codec

// unshuffleVector does nothing without a vector version: unshuffle does
// every element on words.
func unshuffleVector(dst []byte, planes [][]byte) int { return 0 }
