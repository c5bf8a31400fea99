package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/store/archive"
	"github.com/lazyfs/lazyfs/engine/units"
)

func runExport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := newFlags("export", "-D DIR -o FILE|-", `
Write the snapshot in DIR (a directory, s3://BUCKET/PREFIX, or another
archive) into one file, FILE, or onto standard output with -o -: to move
it between hosts, keep it, or upload it. The archive is a POSIX tar of a
directory holding the snapshot's files, the manifest last; tar -x unpacks
it into a snapshot directory.

An archive is a snapshot wherever a snapshot directory is accepted:
snapctl restore -D FILE (eager or --lazy), lazyfs FILE MNT, inspect and
verify read it in place, with the same checks as a directory. Like a
snapshot directory, it must be yours or root's and writable by nobody
else (--trust-snapshot accepts it otherwise).

Every file is checked against the size and CRC32C the manifest gives as
it is copied: a snapshot that does not match its manifest is not exported
(exit status 7). A sealed snapshot is exported sealed, without its key.
An incremental snapshot (dump --parent) is refused: its parent's blocks
would be missing. FILE is written whole or not at all (a temporary file
renamed into place, mode 0600), and an existing FILE is refused.`,
		[]int{cli.ExitBadSnapshot, cli.ExitUntrusted}, stdout, stderr)
	dir := fl.String("D", "", "the snapshot `DIR`")
	fl.Alias("images-dir", "D")
	out := fl.String("o", "", "write the archive into `FILE`, or onto standard output if -")
	fl.Alias("output", "o")
	trust := trustFlag(fl)
	remote := cli.RemoteFlags(fl, false)
	if err := fl.Parse(args); err != nil {
		return err
	}
	if err := requireDir(*dir); err != nil {
		return err
	}
	if *out == "" {
		return cli.Usagef("-o FILE (--output) is required: the archive to write, or - for standard output")
	}
	if err := remote.Check(*dir); err != nil {
		return err
	}
	if *out == "-" && isTerminal(stdout) {
		return cli.Usagef("-o -: standard output is a terminal; redirect it, or give a FILE")
	}
	st, err := image.OpenStore(*dir, image.OpenOptions{Trust: *trust, Remote: remote.Options(ctx)})
	if err != nil {
		return fmt.Errorf("open snapshot: %w", err)
	}
	defer st.Close()
	// The archive's directory: the snapshot's name (s3://B/P: P's last
	// component, or B).
	top := strings.TrimSuffix(path.Base(strings.TrimRight(*dir, "/")), ".tar")
	if top == "" || top == "." || top == "/" || top == ".." {
		top = "snapshot"
	}
	var progress func(done, total uint64)
	if isTerminal(stderr) {
		progress = progressPrinter(stderr, "export", time.Second)
	}
	if *out == "-" {
		return archive.Write(ctx, st, top, stdout, progress)
	}
	n, err := writeWhole(*out, func(w io.Writer) error { return archive.Write(ctx, st, top, w, progress) })
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "exported %s into %s (%s)\n", *dir, *out, units.FormatSize(uint64(n)))
	return nil
}

// writeWhole writes a new file, path, with write: into a temporary file
// of its directory (mode 0600), synced, then renamed to path unless path
// exists. On any error nothing is left. It returns the size written.
func writeWhole(path string, write func(io.Writer) error) (int64, error) {
	if _, err := os.Lstat(path); err == nil {
		return 0, fmt.Errorf("%s exists: remove it, or give another name", path)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name()) // after the rename, nothing
	err = write(f)
	if err == nil {
		err = f.Sync()
	}
	var n int64
	if err == nil {
		var fi os.FileInfo
		if fi, err = f.Stat(); err == nil {
			n = fi.Size()
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, f.Name(), unix.AT_FDCWD, path, unix.RENAME_NOREPLACE); err != nil {
		if err == unix.EEXIST {
			return 0, fmt.Errorf("%s exists: remove it, or give another name", path)
		}
		return 0, &os.PathError{Op: "rename", Path: path, Err: err}
	}
	// The rename itself made durable.
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return n, nil
}
