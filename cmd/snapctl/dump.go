package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine"
	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/fds"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/seal"
	"github.com/lazyfs/lazyfs/engine/units"
)

// runDump is snapctl dump: flags to engine.DumpOptions, in named steps:
// the flags and their checks, the options, the dump run and reported.
func runDump(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl, f := newDumpFlags(stdout, stderr)
	if err := fl.Parse(args); err != nil {
		return err
	}
	mode, err := f.check(fl)
	if err != nil {
		return err
	}
	log, closeLog, err := f.log.Logger(stderr)
	if err != nil {
		return err
	}
	defer closeLog()
	opts, err := f.options(ctx, fl, mode, log)
	if err != nil {
		return err
	}
	if isTerminal(stderr) {
		opts.Progress = progressPrinter(stderr, "dump", time.Second)
	}
	res, err := engine.Dump(ctx, opts)
	if res != nil {
		printDumped(stdout, res, *f.parent)
	}
	if err == nil && *f.statsFile != "" {
		err = writeStats(*f.statsFile, newDumpStats(*f.dir, res))
	}
	return err
}

// dumpFlags are snapctl dump's flags.
type dumpFlags struct {
	pid            *int
	dir            *string
	leave          *bool
	compress       *bool
	block          *cli.Size
	noCompress     *bool
	codecName      *string
	encryptTo      *[]string
	sign           *string
	parent         *string
	preCopy        *bool
	preRounds      *int
	preTime        *time.Duration
	tcpEstablished *bool
	external       []string
	ghostLimit     *cli.Size
	shellJob       *bool
	log            *cli.LogFlags
	statsFile      *string
	remote         *cli.Remote
}

// newDumpFlags defines snapctl dump's flags, its help and its exit
// statuses.
func newDumpFlags(stdout, stderr io.Writer) (*cli.FlagSet, *dumpFlags) {
	fl := newFlags("dump", "-t PID -D DIR [options]", dumpHelp,
		[]int{cli.ExitUnsupported, cli.ExitNoProcess, cli.ExitBadSnapshot, cli.ExitFileChanged, cli.ExitNoPrivilege}, stdout, stderr)
	f := &dumpFlags{}
	f.pid = fl.Int("t", 0, "the `PID` of the process to dump")
	fl.Alias("tree", "t")
	f.dir = fl.String("D", "", "the snapshot directory `DIR` (created if missing; must not hold a snapshot)")
	fl.Alias("images-dir", "D")
	f.leave = fl.Bool("leave-running", false, "resume the process after the dump instead of killing it")
	f.compress = fl.Bool("compress", false, "one page (4 KiB) per block: best ratio, most index")
	f.block = fl.Size("compress-block", 0, "block `SIZE`: a power of two from 4K to 4M (default 256K)")
	f.noCompress = fl.Bool("no-compress", false, "store every non-zero block raw (--codec none)")
	f.codecName = fl.String("codec", codec.DefaultMode.String(), "block `CODEC`: lz4, shuffle-lz4, shuffle-huff or none (see Description)")
	f.encryptTo = fl.Strings("encrypt-to", "seal the snapshot for `RECIPIENT`: an age public key (age1...), a file of them, or an age identity file (repeatable)")
	f.sign = fl.String("sign", "", "sign the snapshot with the OpenSSH ed25519 private key in `KEY` (ssh-keygen -t ed25519)")
	f.parent = fl.String("parent", "", "incremental: store only the blocks that differ from the snapshot in `DIR` (see Description)")
	fl.Alias("prev-images-dir", "parent")

	f.preCopy = fl.Bool("pre-copy", false, "copy memory while the process runs, then freeze it only to copy what it wrote since")
	f.preRounds = fl.Int("pre-copy-rounds", engine.DefaultPreCopyRounds, "with --pre-copy: at most `N` copy rounds before the freeze")
	f.preTime = fl.Duration("pre-copy-time", engine.DefaultPreCopyTime, "with --pre-copy: start no round after `DURATION`")
	fl.Int("decompress-threads", 1, "`N` is accepted and ignored: a dump only encodes (restore and lazyfs decode)")
	f.tcpEstablished = fl.Bool("tcp-established", false, "keep established TCP connections (TCP_REPAIR), held by an nftables lock until the restore")
	fl.Func("external", "record the descriptor leading outside the process (the tree) that `RES` names instead of refusing it: stdio (fds 0-2), fd[N], pipe[INO], unix[INO]; repeat or separate with commas", func(v string) error {
		f.external = append(f.external, strings.Split(v, ",")...)
		return nil
	})
	f.ghostLimit = fl.Size("ghost-limit", fds.DefaultGhostLimit, "keep in the snapshot the contents of the open or mapped files that were deleted, up to `SIZE` each (0: refuse them)")
	f.shellJob = fl.Bool("shell-job", false, "record the descriptors on a terminal outside the tree, for restore --shell-job to give them its own")
	f.log = cli.NewLogFlags(fl)
	f.statsFile = statsFlag(fl, "dump")
	f.remote = cli.RemoteFlags(fl, false)
	return fl, f
}

// check refuses the flags that are missing or go against each other, as
// far as it can before the logger is opened, and returns the codec.
func (f *dumpFlags) check(fl *cli.FlagSet) (codec.Mode, error) {
	if *f.pid <= 0 {
		return 0, cli.Usagef("-t PID (--tree) is required")
	}
	if f.ghostLimit.V < 0 || f.ghostLimit.V > fds.MaxGhostLimit {
		return 0, cli.Usagef("--ghost-limit %s: want at most %s", f.ghostLimit, units.FormatSize(fds.MaxGhostLimit))
	}
	if f.ghostLimit.V == 0 {
		f.ghostLimit.V = -1 // none kept: a deleted open file is refused
	}
	if err := checkStats(*f.statsFile); err != nil {
		return 0, err
	}
	if err := requireDir(*f.dir); err != nil {
		return 0, err
	}
	mode, err := codec.ParseMode(*f.codecName)
	if err != nil {
		return 0, cli.Usagef("--codec: %v", err)
	}
	codecGiven := false
	fl.Visit(func(f *flag.Flag) { codecGiven = codecGiven || f.Name == "codec" })
	if *f.noCompress && codecGiven && mode != codec.NoCompress {
		return 0, cli.Usagef("--no-compress and --codec %s are exclusive", mode)
	}
	if err := f.remote.Check(*f.dir); err != nil {
		return 0, err
	}
	return mode, nil
}

// options returns the dump's options, refusing the flags that the checks
// before the logger was opened left.
func (f *dumpFlags) options(ctx context.Context, fl *cli.FlagSet, mode codec.Mode, log *slog.Logger) (engine.DumpOptions, error) {
	opts := engine.DumpOptions{PID: *f.pid, Dir: *f.dir, LeaveRunning: *f.leave, BlockSize: codec.DefaultBlockSize, Mode: mode, Remote: f.remote.Options(ctx),
		TCPEstablished: *f.tcpEstablished, ShellJob: *f.shellJob, GhostLimit: f.ghostLimit.V, Logger: log}
	if len(f.external) > 0 {
		ext, err := fds.ParseExternal(f.external)
		if err != nil {
			return opts, cli.Usagef("%v", err)
		}
		opts.External = ext
	}
	if *f.preCopy {
		if *f.preRounds < 1 || *f.preTime <= 0 {
			return opts, cli.Usagef("--pre-copy-rounds must be at least 1 and --pre-copy-time positive")
		}
		opts.PreCopy = &engine.PreCopyOptions{MaxRounds: *f.preRounds, MaxTime: *f.preTime}
	} else {
		set := false
		fl.Visit(func(f *flag.Flag) { set = set || f.Name == "pre-copy-rounds" || f.Name == "pre-copy-time" })
		if set {
			return opts, cli.Usagef("--pre-copy-rounds and --pre-copy-time need --pre-copy")
		}
	}
	n := 0
	for _, b := range []bool{*f.compress, f.block.Given, *f.noCompress} {
		if b {
			n++
		}
	}
	if n > 1 {
		return opts, cli.Usagef("--compress, --compress-block and --no-compress are exclusive")
	}
	if *f.parent != "" {
		if len(*f.encryptTo) > 0 || *f.sign != "" {
			return opts, cli.Usagef("--parent: an incremental snapshot cannot be sealed (--encrypt-to) or signed (--sign)")
		}
		opts.Parent = *f.parent
		opts.BlockSize = 0 // the parent's, unless given below
	}
	switch {
	case *f.compress:
		opts.BlockSize = codec.PageSize
	case f.block.Given:
		if b := f.block.V; b < codec.PageSize || b > codec.MaxBlockSize || b&(b-1) != 0 {
			return opts, cli.Usagef("--compress-block %s: must be a power of two from 4K to 4M", units.FormatSize(uint64(b)))
		}
		opts.BlockSize = int(f.block.V)
	}
	if *f.noCompress {
		opts.Mode = codec.NoCompress
	}
	return opts, f.keys(&opts)
}

// keys sets the recipients that seal the snapshot (--encrypt-to) and the
// key that signs it (--sign).
func (f *dumpFlags) keys(opts *engine.DumpOptions) error {
	if len(*f.encryptTo) > 0 {
		rs, names, err := seal.ParseRecipients(*f.encryptTo)
		if err != nil {
			return cli.Usagef("--encrypt-to: %v", err)
		}
		opts.Seal = &image.SealOptions{Recipients: rs, Names: names}
	}
	if *f.sign != "" {
		k, err := seal.ParseSigner(*f.sign)
		if err != nil {
			return cli.Usagef("--sign: %v", err)
		}
		opts.Sign = k
	}
	return nil
}

// printDumped prints the dump's summary: what it wrote, and what it took
// from the parent (--parent), the connections it holds and its pre-copy
// rounds, if any.
func printDumped(w io.Writer, res *engine.DumpResult, parent string) {
	s := res.Stats
	fmt.Fprintf(w, "dumped pid %d (%s): %s of memory into %s (ratio %.3f) in %s; frozen %s\n",
		res.PID, processesThreads(res.Processes, res.Threads), units.FormatSize(s.Total.Bytes), units.FormatSize(s.FileSize), s.Ratio(),
		res.Total.Round(time.Millisecond), res.Freeze.Round(time.Millisecond))
	if parent != "" {
		fmt.Fprintf(w, "incremental: %s in %d blocks taken from parent %s; %s in %d blocks changed or new (%d of them all zeros)\n",
			units.FormatSize(s.Parent.Bytes), s.Parent.Blocks, parent, units.FormatSize(s.Total.Bytes-s.Parent.Bytes), s.Total.Blocks-s.Parent.Blocks, s.Zero.Blocks)
	}
	if res.Conns > 0 {
		fmt.Fprintf(w, "%d TCP connections held by nftables table inet %s until snapctl restore --tcp-established\n", res.Conns, res.NetLock)
	}
	if p := res.PreCopy; p != nil {
		var copied uint64
		for _, r := range p.Rounds {
			copied += r.Copied
		}
		fmt.Fprintf(w, "pre-copy: %d rounds copied %s in %s (paused %s to set up); frozen copy %s\n",
			len(p.Rounds), units.FormatSize(copied), p.Time.Round(time.Millisecond), p.Pause.Round(time.Millisecond), units.FormatSize(p.FrozenCopy))
	}
}

// dumpHelp is snapctl dump's description, in its --help and its manual
// page.
const dumpHelp = `
Freeze every thread of process PID and of all its descendants (the tree
whose root PID is, as criu dump -t), write their snapshot into DIR, then kill
them (or resume them with --leave-running). Every process is stopped before
any is read: the snapshot is one instant of the tree. Memory is stored in blocks: all-zero
blocks take no space, others are compressed when that saves more than
12.5% and stored raw otherwise. The manifest (DIR/snapshot.json) is written
last: a failed dump leaves the processes running and no manifest behind.

--codec chooses how blocks are compressed:
  lz4           LZ4
  shuffle-lz4   LZ4, or the block byte-shuffled into planes of 2- or 4-byte
                elements (the high bytes of every value together, then the
                low bytes), each plane LZ4-compressed or raw: whichever is
                smallest. Model weights (bf16, fp16, float32) shrink.
  shuffle-huff  as shuffle-lz4 with Huffman-coded planes (huff0): smaller
                weights, slower to decode
  none          as --no-compress
Snapshots with shuffled blocks need a lazyfs that reads them (older builds
refuse them with exit status 7).

With --encrypt-to the snapshot is sealed: a random data key, wrapped with
age for each recipient, encrypts and authenticates every block of memory
(AES-256-GCM, bound to its snapshot, process, block and address), the
process state and the page index; the manifest is authenticated. Readers
then need an identity (--identity FILE or $LAZYFS_IDENTITY). A recipient is
an age public key (age1..., from age-keygen), a file of them, or an age
identity file, whose own recipient is used (one key file then seals and
opens).

With --sign KEY (an OpenSSH ed25519 private key without a passphrase:
ssh-keygen -t ed25519 -N '' -f KEY) the manifest is signed, and holds the
SHA-256 of every file and block: integrity and origin, with or without
--encrypt-to. Readers verify it with the public key (--identity KEY.pub).
Encryption alone does not say who dumped: anyone who knows a recipient can
seal a snapshot for it; --sign does.

With --pre-copy, memory is first copied while the process runs, in rounds
that each copy what was written since the previous one (writes are tracked
with userfaultfd write-protection in asynchronous mode and PAGEMAP_SCAN),
while that shrinks; the process is then frozen only to copy what it wrote
since the last round, its registers and its descriptors. The snapshot is
the same as without --pre-copy: the memory at the freeze. With
--leave-running the process runs on after a short pause. Write tracking is
removed from the process when the dump ends, however it ends (if snapctl
is killed, the kernel removes it). snapctl holds a copy of the memory until
it is written. --pre-copy dumps a single process (no children).

With --parent DIR the snapshot is incremental: a block whose bytes are
those of DIR's block at the same address (of the process with the same
pid) is not stored again, only referenced. "The same" is decided by
comparing the bytes with DIR's block, decoded and checked, never by
checksum alone. The unit is the block: a write anywhere in one stores it
whole (a DIR dumped with smaller blocks makes that finer). The snapshot
records DIR's path (relative to itself if DIR was given relative: move
the two together) and the SHA-256 of DIR's manifest; restore, verify,
inspect and lazyfs follow the chain, and refuse it if DIR is missing
(exit status 7) or is not the snapshot dumped against (replaced or
edited: exit status 9). DIR may be incremental itself: a chain holds at
most 16 snapshots below the newest.
The block size is DIR's (--compress or --compress-block must agree with
it: exit status 3); --codec may differ. With --pre-copy, --leave-running
and process trees it works as without. Not with --encrypt-to or --sign
(exit status 2), nor with a sealed or signed DIR (exit status 3). Keep
DIR as long as a snapshot based on it is kept. --prev-images-dir is an
alias, but DIR is a path from the current directory as every path here,
where criu reads it from the images directory.

Refused: a process (or descendant) already being traced or stopped by a
debugger, a zombie child its parent has not reaped, a pipe whose other end
is outside the tree (unless --external names it), and anything the format
cannot describe yet; the error names the process and the resource.

Established TCP connections are recorded to be closed at restore (their
peers see a reset), unless --tcp-established: each is then taken with
TCP_REPAIR (sequence numbers, queued bytes, window, MSS, window scale,
SACK, timestamps) and held by a network lock, an nftables table of its own
(inet lazyfs_PID_RANDOM, printed; one for the whole tree) that drops its
packets, so that neither side resets it, until snapctl restore
--tcp-established brings it back and deletes the table. With
--leave-running, or if the dump fails, the connections go on and the table
is deleted before snapctl returns.

--external records a descriptor leading outside the tree (a pipe whose
other end a process outside holds, a unix socket connected to one; a pipe
or socket pair between two processes of the tree is not outside) by its
key, pipe:[INO] or socket:[INO]: restore gives it a descriptor of its own
with --inherit-fd fd[N]:KEY, or /dev/null. A daemon started from a shell
whose stdio are pipes: --external stdio. fd[N] names descriptor N of any
process of the tree that leads outside.

A descriptor on a terminal outside the tree (a server started from an
interactive shell holds /dev/pts/N) is refused: restore would have to
reopen the terminal by its name, which may be gone or another session's
by then. With --shell-job (as criu dump --shell-job) it is recorded as
leading outside, key tty, and restore --shell-job gives it the terminal of
the snapctl that restores. A pseudo-terminal master is refused.

An open file that was deleted (a rotated log, a temporary file unlinked
once opened), and a file mapped privately that was deleted (a library or
the program itself, replaced by a package upgrade while it ran), is kept
in the snapshot, contents, owner and mode, up to --ghost-limit (1M by
default); restore makes a new file of them, never linked, in the
directory the old one was in, and opens or maps it again. A larger one is
refused, naming it and the flag (a program or library often needs
--ghost-limit 64M).`

// processesThreads says how many threads, and processes if more than
// one, a dump or restore had.
func processesThreads(procs, threads int) string {
	if procs > 1 {
		return fmt.Sprintf("%d processes, %d threads", procs, threads)
	}
	return fmt.Sprintf("%d threads", threads)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// progressPrinter returns a progress callback that starts printing after
// delay, on a terminal: the amount done of the total, the percentage, the
// rate since the line started and the time left at that rate, repainted
// in place at most every progressEvery (a fill reports every block: a
// 4 GiB restore would repaint thousands of times), and ended once all is
// done. A new total, or a new start after the end (the next process of a
// tree), starts a new line.
func progressPrinter(w io.Writer, what string, delay time.Duration) func(done, total uint64) {
	return newProgress(w, what, delay, time.Now).report
}

// progressEvery is the shortest time between two repaints: ten a second.
const progressEvery = 100 * time.Millisecond

// progress is one progressPrinter.
type progress struct {
	mu      sync.Mutex
	w       io.Writer
	what    string
	delay   time.Duration
	now     func() time.Time
	start   time.Time // of the command, for the delay
	line    time.Time // of the line's total, for the rate
	total   uint64
	painted time.Time // the last repaint of the line; zero before the first
	ended   bool
}

func newProgress(w io.Writer, what string, delay time.Duration, now func() time.Time) *progress {
	t := now()
	return &progress{w: w, what: what, delay: delay, now: now, start: t, line: t}
}

func (p *progress) report(done, total uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.now()
	if total != p.total || p.ended && done < total {
		if !p.painted.IsZero() && !p.ended {
			fmt.Fprintln(p.w)
		}
		p.total, p.line, p.painted, p.ended = total, t, time.Time{}, false
	}
	last := done >= total
	if p.ended || t.Sub(p.start) < p.delay || !last && !p.painted.IsZero() && t.Sub(p.painted) < progressEvery {
		return
	}
	p.painted = t
	pct := 100.0
	if total > 0 {
		pct = 100 * float64(done) / float64(total)
	}
	line := fmt.Sprintf("%s: %s of %s (%.0f%%)", p.what, units.FormatSize(done), units.FormatSize(total), pct)
	if secs := t.Sub(p.line).Seconds(); secs > 0 && done > 0 {
		rate := float64(done) / secs
		line += fmt.Sprintf(", %s/s", units.FormatSize(uint64(rate)))
		if !last {
			left := time.Duration(float64(total-done) / rate * float64(time.Second))
			line += fmt.Sprintf(", %s left", left.Round(time.Second))
		}
	}
	fmt.Fprintf(p.w, "\r%s\x1b[K", line)
	if last {
		p.ended = true
		fmt.Fprintln(p.w)
	}
}
