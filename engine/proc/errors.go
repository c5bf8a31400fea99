package proc

import "errors"

var (
	// ErrMalformed is wrapped by every error about input that does not have
	// the format of the /proc file it claims to be.
	ErrMalformed = errors.New("malformed /proc data")
	// ErrTooLarge is wrapped by errors about input exceeding a hard limit
	// (a line, a count or a file size) set to keep allocations bounded.
	ErrTooLarge = errors.New("/proc data exceeds limit")
	// ErrUnsupported is returned when the running kernel lacks an interface
	// (PAGEMAP_SCAN) or a query asks for something a method cannot answer.
	ErrUnsupported = errors.New("unsupported by this kernel or method")
)
