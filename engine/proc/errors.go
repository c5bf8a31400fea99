package proc

import "errors"

// Sentinel errors. An interface the running kernel lacks (PAGEMAP_SCAN),
// or a query a method cannot answer, gives an error that matches the
// standard library's errors.ErrUnsupported, as ENOSYS and EOPNOTSUPP do:
// proc has no sentinel of its own for it.
var (
	// ErrMalformed is wrapped by every error about input that does not have
	// the format of the /proc file it claims to be.
	ErrMalformed = errors.New("malformed /proc data")
	// ErrTooLarge is wrapped by errors about input exceeding a hard limit
	// (a line, a count or a file size) set to keep allocations bounded.
	ErrTooLarge = errors.New("/proc data exceeds limit")
)
