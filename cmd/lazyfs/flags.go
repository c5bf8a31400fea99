package main

import (
	"context"
	"io"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine"
	"github.com/lazyfs/lazyfs/engine/image/seal"
	"github.com/lazyfs/lazyfs/fs"
)

// config is the parsed command line.
type config struct {
	snapshot, mountpoint string
	unmount              bool // -u MOUNTPOINT
	force                bool // with -u
	cacheSize            *cli.Size
	threads              int
	allowOther           bool
	directIO             bool
	background           bool
	debug                bool
	logFile              string
	version              bool
	completion           string // --completion SHELL
	manpages             string // --manpages DIR
	trust                bool
	remote               *cli.Remote
	identity             func() (*seal.Keyring, error)
}

// options turns the command line into mount options.
func (c *config) options(ctx context.Context) fs.Options {
	return fs.Options{
		CacheSize:         c.cacheSize.V,
		DecompressThreads: c.threads,
		AllowOther:        c.allowOther,
		DirectIO:          c.directIO,
		Debug:             c.debug,
		TrustSnapshot:     c.trust,
		Remote:            c.remote.Options(ctx),
	}
}

const about = `
lazyfs mounts the snapshot SNAPSHOT (a directory written by snapctl dump,
s3://BUCKET/PREFIX, or an archive written by snapctl export) read-only on
MOUNTPOINT, and serves it until it is unmounted (lazyfs -u,
Ctrl-C, SIGTERM: each unmounts, and lazyfs exits 0). Memory is decoded
block by block as it is read, through a cache shared by every file of the
mount; the kernel keeps what it read in its page cache between opens.

Files:
  MOUNTPOINT/snapshot.json          the manifest
  MOUNTPOINT/PID/maps               the dumped VMAs, formatted as /proc/PID/maps
  MOUNTPOINT/PID/mem                the address space as a sparse file: offset =
                                    virtual address; holes where nothing was
                                    dumped (lseek SEEK_DATA/SEEK_HOLE, cp
                                    --sparse=always, st_blocks = dumped bytes)
  MOUNTPOINT/PID/core               an ELF core file of the process at the
                                    dump (threads' registers, auxv, mapped
                                    files, memory), made as it is read:
                                    gdb EXE MOUNTPOINT/PID/core
  MOUNTPOINT/PID/regions/START-END-PERMS[-NAME]
                                    one file per dumped VMA, its memory
  MOUNTPOINT/PID/process.json       the process state (registers, fds, VMAs...)
  MOUNTPOINT/PID/stats              blocks by kind, stored and original bytes,
                                    ratio, cache hits/misses/evictions

Memory images hold secrets: the mount is owner-only (files 0400, directories
0500, owned by the user who mounted, checked by the kernel) unless
--allow-other is given.

A corrupt block makes the reads that touch it fail with EIO (logged with its
file, block and address); the rest of the snapshot stays readable. A
snapshot without its manifest (an unfinished dump) is refused.

A sealed snapshot (snapctl dump --encrypt-to) is mounted with --identity (or
$LAZYFS_IDENTITY), a signed one with the signer's public key: its manifest,
state and index are authenticated at mount time, and each block is decrypted and authenticated as it is read, into the
memory cache; decrypted bytes are never written to a disk. A block that fails
its authentication fails the reads that touch it with EIO, like a corrupt
one.`

const examples = `
Examples:
  lazyfs /var/snap/redis /mnt/redis &
  xxd -s 0x7f3a1c000000 -l 64 /mnt/redis/4242/mem
  strings /mnt/redis/4242/regions/* | grep secret
  cp --sparse=always /mnt/redis/4242/mem /tmp/redis.mem
  gdb -batch -ex 'thread apply all bt' /usr/bin/redis-server /mnt/redis/4242/core
  lazyfs -u /mnt/redis`

// command is lazyfs's command line, for its help.
var command = cli.Command{
	Name:     "lazyfs",
	Synopsis: []string{"[options] SNAPSHOT MOUNTPOINT", "-u [--force] MOUNTPOINT", "--completion bash|zsh|fish", "--manpages DIR"},
	About:    about,
	Footer:   examples,
	Exits:    []int{cli.ExitBadSnapshot, cli.ExitUntrusted, cli.ExitFileChanged, cli.ExitNoPrivilege},
	Server:   true,
}

// newFlagSet returns the flags of lazyfs bound to c.
func newFlagSet(c *config, stdout, stderr io.Writer) *cli.FlagSet {
	f := command.Flags(stdout, stderr)
	c.cacheSize = f.Size("cache-size", fs.DefaultCacheSize, "keep up to `SIZE` of decoded blocks in memory, shared by the whole mount, until the page cache holds them whole: bytes, or with a K, M or G suffix")
	f.IntVar(&c.threads, "decompress-threads", 1, "decode the blocks of one request with up to `N` threads: 1 serial, 0 automatic from the CPU affinity mask and the work, N > 1 a maximum")
	f.BoolVar(&c.allowOther, "allow-other", false, "let other users reach the files (FUSE allow_other; non-root needs user_allow_other in /etc/fuse.conf). Off by default: memory images hold secrets")
	f.BoolVar(&c.directIO, "direct-io", false, "serve mem and region files with direct I/O instead of keeping them in the page cache: for one reader that reads everything once; rereads and small reads are much slower")
	f.BoolVar(&c.background, "background", false, "detach once the mount is ready and serving; exit non-zero with the error if it cannot be")
	f.BoolVar(&c.debug, "debug", false, "log every FUSE request and reply (go-fuse debug log)")
	f.StringVar(&c.logFile, "log", "", "append log records to `FILE` instead of standard error (with --background they are discarded otherwise)")
	f.BoolVar(&c.unmount, "u", false, "unmount the lazyfs mount on `MOUNTPOINT` (like fusermount3 -u) and exit once its file system is gone and its server exits; refused while files on it are open, and said if another mount namespace still holds it (which process's)")
	f.BoolVar(&c.trust, "trust-snapshot", false, "accept a snapshot that users other than you and root can change (its directory or a file writable by group or others, or owned by another user): a snapshot is memory and code a restore runs")
	c.identity = f.Identity()
	f.BoolVar(&c.version, "version", false, "print the version and exit")
	f.StringVar(&c.completion, "completion", "", "print the completion script for `SHELL` (bash, zsh or fish) and exit; make install installs them")
	f.StringVar(&c.manpages, "manpages", "", "write the manual page lazyfs(8), made from this help, into `DIR` and exit")
	c.remote = cli.RemoteFlags(f, true)
	f.BoolVar(&c.force, "force", false, "with -u: abort the mount's FUSE connection first (umount -f), so that it unmounts even with files open (they then fail with ENOTCONN) or with its server stuck or gone")
	return f
}

// tool describes lazyfs for its manual page and completion scripts.
func tool() cli.Tool {
	d := &cli.Describer{}
	newFlagSet(&config{}, d, io.Discard).Parse([]string{"--help"})
	return cli.Tool{
		Name:    "lazyfs",
		Summary: "mount a lazyfs snapshot as files, decoded as they are read",
		Version: "lazyfs " + engine.Version,
		Top:     d.Set,
		SeeAlso: []string{"snapctl(8)", "fusermount3(1)"},
	}
}

// parseArgs parses the command line. Options may come before, between or
// after the two operands; "--" ends the options.
func parseArgs(args []string, stdout, stderr io.Writer) (*config, error) {
	c := &config{}
	f := newFlagSet(c, stdout, stderr)
	pos, err := f.ParseOperands(args)
	if err != nil {
		return nil, err
	}
	if c.version || c.completion != "" || c.manpages != "" {
		return c, nil
	}
	if c.force && !c.unmount {
		return nil, cli.Usagef("--force goes with -u MOUNTPOINT")
	}
	if c.unmount {
		if len(pos) != 1 {
			return nil, cli.Usagef("-u takes one MOUNTPOINT, got %d arguments", len(pos))
		}
		c.mountpoint = pos[0]
		return c, nil
	}
	if len(pos) != 2 {
		return nil, f.Usagef("want SNAPSHOT and MOUNTPOINT, got %d arguments", len(pos))
	}
	if c.threads < 0 {
		return nil, cli.Usagef("--decompress-threads %d: want 0 (automatic), 1 (serial) or more", c.threads)
	}
	c.snapshot, c.mountpoint = pos[0], pos[1]
	if err := c.remote.Check(c.snapshot); err != nil {
		return nil, err
	}
	return c, nil
}
