package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/workingset"
	"github.com/lazyfs/lazyfs/engine/units"
)

// runVerify is snapctl verify: every block and file of a snapshot checked.
func runVerify(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := newFlags("verify", "-D DIR [--decompress-threads N]", `
Check a snapshot: the manifest, every file's size and checksum, and every
block of memory against its CRC32C; for a sealed snapshot, opened with
--identity, every block, file and the manifest are authenticated too. Exits
non-zero at the first bad block, naming the file, the block and its
address. An incremental snapshot (dump --parent) is checked with the chain
of snapshots it takes blocks from: each parent must be the one dumped
against (exit status 9 if not, 7 if missing), and every block and pages
file of the chain that the snapshot uses is checked.`,
		[]int{cli.ExitBadSnapshot, cli.ExitUntrusted, cli.ExitFileChanged, cli.ExitNoPrivilege}, stdout, stderr)
	dir := fl.String("D", "", "the snapshot `DIR`: a directory, s3://BUCKET/PREFIX, or an archive file (snapctl export)")
	fl.Alias("images-dir", "D")
	threads := threadsFlag(fl)
	trust := trustFlag(fl)
	remote := cli.RemoteFlags(fl, true)
	identity := fl.Identity()
	if err := fl.Parse(args); err != nil {
		return err
	}
	if err := requireDir(*dir); err != nil {
		return err
	}
	if err := remote.Check(*dir); err != nil {
		return err
	}
	keys, err := identity()
	if err != nil {
		return err
	}
	s, err := image.OpenWith(*dir, image.OpenOptions{Trust: *trust, Remote: remote.Options(ctx), Keys: keys})
	if err != nil {
		return fmt.Errorf("open snapshot: %w", err)
	}
	defer s.Close()
	for _, pid := range s.PIDs() {
		if err := verifyProcess(ctx, s, pid, *threads, stdout); err != nil {
			return err
		}
	}
	printVerified(stdout, s, *dir)
	return nil
}

// verifyProcess checks the state and every block of process pid of s,
// and the pages files of the chain below an incremental snapshot; then
// says whether its working set, if any, would be used.
func verifyProcess(ctx context.Context, s *image.Snapshot, pid, threads int, stdout io.Writer) error {
	if _, err := s.State(pid); err != nil {
		return err
	}
	r, err := s.OpenPages(pid, image.ReaderOptions{Threads: threads})
	if err != nil {
		return err
	}
	err = r.Verify(ctx, nil)
	if err == nil {
		err = s.VerifyPagesFile(pid)
	}
	// An incremental snapshot: the pages files of the chain below.
	for p := s.Parent(); p != nil && err == nil; p = p.Parent() {
		if _, ok := p.Manifest.Process(pid); ok {
			err = p.VerifyPagesFile(pid)
		}
	}
	st := r.Stats()
	r.Close()
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	fmt.Fprintf(stdout, "process %d: %d blocks, %s of memory in %s: ok\n", pid, st.Total.Blocks, units.FormatSize(st.Total.Bytes), units.FormatSize(st.FileSize))
	// A working set is advice beside the snapshot, not part of it: one
	// that a restore would ignore is reported, never a failure.
	switch ws, err := workingset.Read(s, pid); {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		fmt.Fprintf(stdout, "process %d: working set ignored by restores: %v\n", pid, err)
	default:
		fmt.Fprintf(stdout, "process %d: working set of %d ranges: ok\n", pid, len(ws.Entries))
	}
	return nil
}

// printVerified says what was verified of the snapshot in dir: how it is
// sealed or signed, or the chain below it.
func printVerified(stdout io.Writer, s *image.Snapshot, dir string) {
	switch {
	case s.Sealed() && s.Signed():
		fmt.Fprintf(stdout, "snapshot %s: ok, sealed, authenticated and its signature verified\n", dir)
		return
	case s.Sealed():
		fmt.Fprintf(stdout, "snapshot %s: ok, sealed and authenticated\n", dir)
		return
	case s.Signed():
		fmt.Fprintf(stdout, "snapshot %s: ok, signature verified\n", dir)
		return
	}
	for p := s.Parent(); p != nil; p = p.Parent() {
		fmt.Fprintf(stdout, "parent %s: ok\n", p.Dir)
	}
	fmt.Fprintf(stdout, "snapshot %s: ok\n", dir)
}
