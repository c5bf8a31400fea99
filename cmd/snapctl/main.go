// Command snapctl dumps a running process into a lazyfs snapshot, restores
// it (eagerly or lazily through userfaultfd), and inspects and verifies
// snapshots.
package main

import "github.com/lazyfs/lazyfs/cmd/internal/cli"

func main() { cli.Main("snapctl", run) }
