package kernel

import (
	"fmt"
	"io"
	"os"

	"github.com/lazyfs/lazyfs/engine/proc"
)

// maxFile bounds the files read whole here, as package proc bounds its
// small files.
const maxFile = 16 << 20

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
