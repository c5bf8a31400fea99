// Package e2e holds the end-to-end tests of lazyfs: real processes (the
// fixtures of test/fixtures, python3, redis-server) dumped, inspected and
// verified with the snapctl command built from this checkout.
//
// Tests that need root or ptrace call testutil first, so they skip locally
// without privileges and fail in CI (LAZYFS_TEST_REQUIRE=all). Every
// process a test starts is killed and reaped at its cleanup; every command
// runs under a timeout.
//
// Shared helpers, for the dump tests here and the restore and lazyfs tests
// that follow:
//
//   - snapctl_test.go: [buildTool] builds a command of the module once per test
//     binary; [runSnapctl] runs snapctl with a timeout and returns its exit
//     code and output; [mustSnapctl], [dumpPID] and [verifyDir] wrap it
//     for the common cases; [hasManifest] tells a complete snapshot.
//   - memcheck_test.go: [openImage] opens one process of a snapshot
//     (state and page reader); [takeMemory] records a stopped process's
//     maps, page table and present pages; [checkImage] compares an image
//     with that record and with the process's memory afterwards, exactly,
//     page for page.
//   - lazyfs_test.go: [newMemModel] turns such a record into what a
//     lazyfs mount must show of the process ([memModel]: the dumped pages'
//     bytes, zeros elsewhere), which the lazyfs tests compare with cmp,
//     sha256sum, dd, xxd, strings, lseek, cp --sparse and random preads.
//
// The dump benchmark (dump_bench_test.go) is run with
// `go test -run '^$' -bench BenchmarkDump ./test/`.
package e2e

import (
	"fmt"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	if pid := os.Getenv(holdTracedEnv); pid != "" {
		os.Exit(tracerMain(pid))
	}
	dir, err := os.MkdirTemp("", "lazyfs-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: temp dir for tools:", err)
		os.Exit(1)
	}
	tools.dir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
