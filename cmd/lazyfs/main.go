// Command lazyfs mounts a lazyfs snapshot read-only as FUSE files: the
// memory of every dumped process as a sparse file, one file per VMA, its
// maps and state, decoded block by block as they are read.
package main

import (
	"syscall"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
)

func main() { cli.Main("lazyfs", run, syscall.SIGHUP) }
