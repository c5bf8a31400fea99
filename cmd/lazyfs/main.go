// Command lazyfs mounts a lazyfs snapshot read-only as FUSE files: the
// memory of every dumped process as a sparse file, one file per VMA, its
// maps and state, decoded block by block as they are read.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(report(os.Stderr, err))
}
