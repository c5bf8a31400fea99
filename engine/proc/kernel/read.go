package kernel

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/lazyfs/lazyfs/engine/proc"
)

// maxFile bounds the files read whole here, as package proc bounds its
// small files.
const maxFile = 16 << 20

// maxLine is the longest line a line-by-line parser here accepts, as in
// package proc.
const maxLine = 64 << 10

// newScanner returns a line scanner over r that refuses lines longer than
// maxLine.
func newScanner(r io.Reader) *bufio.Scanner {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 4096), maxLine)
	return s
}

// scanErr converts a scanner error into proc's errors.
func scanErr(err error) error {
	if errors.Is(err, bufio.ErrTooLong) {
		return fmt.Errorf("%w: line longer than %d bytes", proc.ErrTooLarge, maxLine)
	}
	return err
}

// readFile reads a whole file of at most limit bytes. /proc files report a
// size of zero, so the limit is enforced while reading.
func readFile(path string, limit int64) ([]byte, error) {
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
		return nil, fmt.Errorf("read %s: %w: more than %d bytes", path, proc.ErrTooLarge, limit)
	}
	return b, nil
}

// malformed builds a proc.ErrMalformed error for what, quoting a bounded
// prefix of the offending input.
func malformed(what string, input []byte) error {
	const max = 80
	if len(input) > max {
		input = input[:max]
	}
	return fmt.Errorf("%w: %s: %q", proc.ErrMalformed, what, input)
}
