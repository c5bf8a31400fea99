package proc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// Limits that keep every parser's allocations bounded.
const (
	// maxLine is the longest line any parser accepts. A path is at most
	// PATH_MAX (4096) bytes, and the kernel escapes a few bytes as \ooo.
	maxLine = 64 << 10
	// MaxSmallFile bounds files read whole: status, stat, fdinfo, limits,
	// auxv, cmdline (an epoll fdinfo lists every watched fd, hence 16 MiB).
	MaxSmallFile = 16 << 20
)

// NewScanner returns a line scanner over r that refuses lines longer than
// maxLine.
func NewScanner(r io.Reader) *bufio.Scanner {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 4096), maxLine)
	return s
}

// ScanErr converts an error of a NewScanner scanner into this package's
// errors (ErrTooLarge for a line over the bound).
func ScanErr(err error) error {
	if errors.Is(err, bufio.ErrTooLong) {
		return fmt.Errorf("%w: line longer than %d bytes", ErrTooLarge, maxLine)
	}
	return err
}

// ReadFile reads a whole file of at most limit bytes (MaxSmallFile for
// the files read whole here and in proc's subpackages). /proc files report a
// size of zero, so the limit is enforced while reading.
func ReadFile(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("read %s: %w: more than %d bytes", path, ErrTooLarge, limit)
	}
	return b, nil
}

// isSpace reports whether c separates fields in /proc files (a newline
// only where a parser hands over more than one line).
func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' }

// nextField returns the first whitespace-separated field of b and the rest
// of b after it (with leading whitespace removed).
func nextField(b []byte) (field, rest []byte) {
	i := 0
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	j := i
	for j < len(b) && !isSpace(b[j]) {
		j++
	}
	k := j
	for k < len(b) && isSpace(b[k]) {
		k++
	}
	return b[i:j], b[k:]
}

// splitFields appends the whitespace-separated fields of b to dst.
func splitFields(b []byte, dst [][]byte) [][]byte {
	for {
		var f []byte
		f, b = nextField(b)
		if len(f) == 0 {
			return dst
		}
		dst = append(dst, f)
	}
}

// trimSpace removes leading and trailing blanks (and a trailing newline).
func trimSpace(b []byte) []byte {
	for len(b) > 0 && (isSpace(b[0]) || b[0] == '\n') {
		b = b[1:]
	}
	for len(b) > 0 && (isSpace(b[len(b)-1]) || b[len(b)-1] == '\n') {
		b = b[:len(b)-1]
	}
	return b
}

// parseUint parses an unsigned integer in base 8, 10 or 16 (no prefix, no
// sign), rejecting empty input and overflow.
func parseUint(b []byte, base uint64) (uint64, bool) {
	if len(b) == 0 || len(b) > 64 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		var d uint64
		switch {
		case c >= '0' && c <= '9':
			d = uint64(c - '0')
		case c >= 'a' && c <= 'f':
			d = uint64(c-'a') + 10
		case c >= 'A' && c <= 'F':
			d = uint64(c-'A') + 10
		default:
			return 0, false
		}
		if d >= base {
			return 0, false
		}
		if v > (math.MaxUint64-d)/base {
			return 0, false
		}
		v = v*base + d
	}
	return v, true
}

// parseInt parses a decimal integer with an optional leading '-'.
func parseInt(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	u, ok := parseUint(b, 10)
	if !ok {
		return 0, false
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return -int64(u), true
	}
	if u > math.MaxInt64 {
		return 0, false
	}
	return int64(u), true
}

// Malformed builds an ErrMalformed error for what, quoting a bounded prefix
// of the offending input.
func Malformed(what string, input []byte) error {
	const max = 80
	if len(input) > max {
		input = input[:max]
	}
	return fmt.Errorf("%w: %s: %q", ErrMalformed, what, input)
}
