// Command snapctl dumps a running process into a lazyfs snapshot, restores
// it (eagerly or lazily through userfaultfd), and inspects and verifies
// snapshots.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(report(os.Stderr, err))
}
