package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/workingset"
	"github.com/lazyfs/lazyfs/engine/units"
)

func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := newFlags("inspect", "-D DIR [--json]", `
Show what a snapshot holds: its processes, their memory regions, and the
blocks by kind (zero, raw, lz4) with original and stored bytes; for the
children of a tree, how much of their memory they still shared with their
parent copy-on-write (restore forks them from it to share it again); and how to
open each process in a debugger: mounted with lazyfs, MOUNTPOINT/PID/core is
its ELF core file (gdb EXE MOUNTPOINT/PID/core).

For a sealed snapshot (dump --encrypt-to) it says so, with what and for whom,
and for a signed one (dump --sign) by whom; their processes need --identity.
Without one, only the manifest is shown, not authenticated, and inspect exits
0.

For an incremental snapshot (dump --parent) it lists the chain of snapshots
it takes blocks from, each checked to be the one dumped against (exit
status 9 if not, 7 if missing), and the blocks taken from its parent (kind
"parent": no bytes stored in this snapshot).`,
		[]int{cli.ExitBadSnapshot, cli.ExitUntrusted, cli.ExitFileChanged, cli.ExitNoPrivilege}, stdout, stderr)
	dir := fl.String("D", "", "the snapshot `DIR`: a directory, s3://BUCKET/PREFIX, or an archive file (snapctl export)")
	fl.Alias("images-dir", "D")
	asJSON := fl.Bool("json", false, "print JSON instead of text")
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
	rep, err := inspect(*dir, image.OpenOptions{Trust: *trust, Remote: remote.Options(ctx), Keys: keys})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printInspect(stdout, rep)
	return nil
}

type inspectReport struct {
	Dir      string          `json:"dir"`
	Manifest *image.Manifest `json:"manifest"`
	// Sealed: "no" (in clear), "yes" (opened with an identity, every part
	// authenticated) or "unopened" (no identity given: the manifest was
	// not authenticated and the processes are not listed).
	Sealed string `json:"sealed"`
	// Signed: the signature was verified with a key given.
	Signed    bool            `json:"signed"`
	Processes []processReport `json:"processes"`
	// Parents is the chain below an incremental snapshot, parent first.
	Parents []string `json:"parents,omitempty"`
}

type processReport struct {
	PID     int            `json:"pid"`
	Comm    string         `json:"comm"`
	Exe     string         `json:"exe"`
	Threads int            `json:"threads"`
	FDs     int            `json:"fds"`
	Regions []regionReport `json:"regions"`
	Blocks  image.Stats    `json:"blocks"`
	Ratio   float64        `json:"ratio"`
	// Core is the process's ELF core file, relative to a lazyfs mount of
	// the snapshot.
	Core string `json:"core"`
	// Outside lists the descriptors that lead outside the process: those
	// a restore must be handed (--inherit-fd) and the TCP connections
	// kept.
	Outside []outsideReport `json:"outside,omitempty"`
	// WorkingSet is the working set beside the snapshot, if any.
	WorkingSet *workingSetReport `json:"working_set,omitempty"`
	// Parent is the parent's pid, for a process of a tree, and Inherited
	// the bytes of private memory it still shared with it copy-on-write
	// at the dump, which restore shares again.
	Parent    int    `json:"ppid"`
	Inherited uint64 `json:"inherited_bytes"`
}

// outsideReport is a descriptor leading outside the process: a pipe or
// unix socket recorded by --external (Key), or a TCP connection kept by
// --tcp-established (Local, Peer and the nftables table that holds it).
type outsideReport struct {
	FD    int    `json:"fd"`
	Key   string `json:"key,omitempty"`
	Local string `json:"local,omitempty"`
	Peer  string `json:"peer,omitempty"`
	Lock  string `json:"lock,omitempty"`
}

// workingSetReport describes a working set (snapctl restore
// --record-working-set): or why it would be ignored.
type workingSetReport struct {
	File    string  `json:"file"`
	Ignored string  `json:"ignored,omitempty"`
	Ranges  int     `json:"ranges"`
	Bytes   uint64  `json:"bytes"`
	Blocks  int     `json:"blocks"`
	Span    float64 `json:"span_seconds"`
	Stop    string  `json:"stop,omitempty"`
}

// workingSet reports the working set of pid beside the snapshot s (nil if
// there is none): the blocks of r it touches are counted.
func workingSet(s *image.Snapshot, pid int, r *image.Reader) *workingSetReport {
	rep := &workingSetReport{File: filepath.Join(s.Dir, workingset.Name(pid))}
	w, err := workingset.Read(s, pid)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		rep.Ignored = err.Error()
		return rep
	}
	blocks := map[uint64]bool{}
	for _, e := range w.Entries {
		for a := e.Addr; a < e.End(); {
			b, ok := r.BlockAt(a)
			if !ok {
				break
			}
			blocks[b.Addr] = true
			a = b.End()
		}
	}
	rep.Ranges, rep.Bytes, rep.Blocks, rep.Span, rep.Stop = len(w.Entries), w.Bytes(), len(blocks), w.Span.Seconds(), w.Stop
	return rep
}

type regionReport struct {
	Start  uint64 `json:"start"`
	End    uint64 `json:"end"`
	Perms  string `json:"perms"`
	Kind   string `json:"kind"`
	Name   string `json:"name,omitempty"`
	Dumped uint64 `json:"dumped_bytes"`
}

func inspect(dir string, o image.OpenOptions) (*inspectReport, error) {
	s, err := image.OpenWith(dir, o)
	if errors.Is(err, image.ErrNoIdentity) && o.Keys == nil {
		// Say how it is sealed or signed and by whom, without opening it.
		if m, perr := image.PeekManifest(dir, o.Remote); perr == nil && (m.Seal != nil || m.Signature != nil) {
			return &inspectReport{Dir: dir, Manifest: m, Sealed: "unopened"}, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open snapshot: %w", err)
	}
	defer s.Close()
	rep := &inspectReport{Dir: dir, Manifest: s.Manifest, Sealed: "no"}
	if s.Sealed() {
		rep.Sealed = "yes"
	}
	rep.Signed = s.Signed()
	for p := s.Parent(); p != nil; p = p.Parent() {
		rep.Parents = append(rep.Parents, p.Dir)
	}
	for _, pid := range s.PIDs() {
		st, err := s.State(pid)
		if err != nil {
			return nil, err
		}
		r, err := s.OpenPages(pid, image.ReaderOptions{})
		if err != nil {
			return nil, err
		}
		pr := processReport{PID: pid, Comm: st.Comm, Exe: st.Exe.Path, Threads: len(st.Threads), FDs: len(st.FDs), Blocks: r.Stats(), Ratio: r.Stats().Ratio(),
			Core: fmt.Sprintf("%d/core", pid)}
		for _, f := range st.FDs {
			switch {
			case f.External != "":
				pr.Outside = append(pr.Outside, outsideReport{FD: f.FD, Key: f.External})
			case f.Socket != nil && f.Socket.TCP != nil:
				pr.Outside = append(pr.Outside, outsideReport{FD: f.FD, Local: f.Socket.Local, Peer: f.Socket.Peer, Lock: f.Socket.TCP.Lock})
			}
		}
		pr.Parent = st.PPID
		for _, v := range st.VMAs {
			for _, i := range v.Inherited {
				pr.Inherited += i.End - i.Start
			}
			pr.Regions = append(pr.Regions, regionReport{Start: v.Start, End: v.End, Perms: image.Perms(v), Kind: v.Kind, Name: v.Name, Dumped: r.DumpedIn(v.Start, v.End)})
		}
		pr.WorkingSet = workingSet(s, pid, r)
		r.Close()
		rep.Processes = append(rep.Processes, pr)
	}
	return rep, nil
}

// printInspect prints the report in text: the snapshot, then each
// process.
func printInspect(w io.Writer, rep *inspectReport) {
	printManifest(w, rep)
	for _, p := range rep.Processes {
		printProcess(w, rep.Dir, &p)
	}
}

// printManifest prints what the manifest says of the snapshot: its
// format, how it is sealed and signed, and its chain of parents.
func printManifest(w io.Writer, rep *inspectReport) {
	m := rep.Manifest
	fmt.Fprintf(w, "snapshot %s\n  format %s v%d, %s, created %s\n  kernel %s %s, block size %s, compression %s\n",
		rep.Dir, m.Format, m.Version, m.Tool, m.Created.Format("2006-01-02 15:04:05 MST"), m.Kernel.Release, m.Kernel.Machine,
		units.FormatSize(uint64(m.BlockSize)), m.Compression)
	if s := m.Seal; s != nil {
		fmt.Fprintf(w, "  sealed: encrypted with %s (keys by %s from a per-snapshot data key), data key wrapped with %s for %d recipient(s):\n", s.AEAD, s.KDF, s.Wrap, len(s.Recipients))
		for _, r := range s.Recipients {
			fmt.Fprintf(w, "    %s\n", r)
		}
		if s.Window != 0 {
			fmt.Fprintf(w, "  RAW blocks sealed in windows of %s, each authenticated alone (a lazy fault reads its window)\n", units.FormatSize(s.Window))
		}
		if rep.Sealed == "yes" {
			fmt.Fprintf(w, "  opened with an identity: manifest, state, index and keys authenticated\n")
		} else {
			fmt.Fprintf(w, "  not opened (no --identity): this manifest is not authenticated, the processes are not shown\n")
		}
	} else {
		fmt.Fprintf(w, "  not sealed: memory and state in clear\n")
	}
	if s := m.Signature; s != nil {
		fmt.Fprintf(w, "  signed: %s over the manifest, which holds the %s of every file and block, by\n    %s\n", s.Alg, s.Digest, s.Key)
		if rep.Signed {
			fmt.Fprintf(w, "  signature verified with a key given\n")
		} else {
			fmt.Fprintf(w, "  signature not verified (no signer's key given)\n")
		}
	} else if m.Seal == nil {
		fmt.Fprintf(w, "  not signed: checked by CRC32C only, which catches accidents, not edits\n")
	}
	if p := m.Parent; p != nil {
		fmt.Fprintf(w, "  incremental: unchanged blocks are in parent %s (manifest SHA-256 %.16s…); chain depth %d:\n", p.Path, p.Manifest, p.Depth)
		for _, d := range rep.Parents {
			fmt.Fprintf(w, "    %s\n", d)
		}
	}
}

// printProcess prints a process of the snapshot in dir: its regions, its
// blocks by kind, what it shares with its parent, its descriptors leading
// outside, how to debug it and its working set.
func printProcess(w io.Writer, dir string, p *processReport) {
	fmt.Fprintf(w, "\nprocess %d (%s) %s\n  %d threads, %d file descriptors, %d memory regions\n\n", p.PID, p.Comm, p.Exe, p.Threads, p.FDs, len(p.Regions))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  START\tEND\tPERMS\tKIND\tDUMPED\tNAME")
	for _, r := range p.Regions {
		d := "-"
		if r.Dumped > 0 {
			d = units.FormatSize(r.Dumped)
		}
		fmt.Fprintf(tw, "  %x\t%x\t%s\t%s\t%s\t%s\n", r.Start, r.End, r.Perms, r.Kind, d, r.Name)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  BLOCKS\tCOUNT\tORIGINAL\tSTORED\t")
	b := p.Blocks
	for _, k := range []struct {
		name string
		s    image.KindStats
	}{{"zero", b.Zero}, {"raw", b.Raw}, {"lz4", b.LZ4}, {"shuffle", b.Shuffle}, {"parent", b.Parent}, {"forked", b.Forked}, {"total", b.Total}} {
		if (k.name == "parent" || k.name == "forked") && k.s.Blocks == 0 {
			continue
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t\n", k.name, k.s.Blocks, units.FormatSize(k.s.Bytes), units.FormatSize(k.s.Stored))
	}
	tw.Flush()
	fmt.Fprintf(w, "  pages file %s for %s of memory: ratio %.3f (%s)\n", units.FormatSize(b.FileSize), units.FormatSize(b.Total.Bytes), p.Ratio, strings.TrimSpace(fmt.Sprintf("%.1f%% saved", 100*(1-p.Ratio))))
	if p.Inherited > 0 {
		fmt.Fprintf(w, "  %s of private memory shared copy-on-write with its parent %d: shared again at restore\n", units.FormatSize(p.Inherited), p.Parent)
	}
	for _, o := range p.Outside {
		if o.Key != "" {
			fmt.Fprintf(w, "  fd %d leads outside: %s (restore --inherit-fd fd[N]:%s, or --external-fallback null)\n", o.FD, o.Key, o.Key)
		} else {
			fmt.Fprintf(w, "  fd %d TCP connection %s-%s kept, held by nftables table inet %s (restore --tcp-established)\n", o.FD, o.Local, o.Peer, o.Lock)
		}
	}
	exe := p.Exe
	if exe == "" {
		exe = "EXE"
	}
	fmt.Fprintf(w, "  debug it: lazyfs %s MNT, then gdb %s MNT/%s (an ELF core file made as it is read)\n", shellQuote(dir), shellQuote(exe), p.Core)
	switch ws := p.WorkingSet; {
	case ws == nil:
		fmt.Fprintf(w, "  working set: none\n")
	case ws.Ignored != "":
		fmt.Fprintf(w, "  working set: ignored: %s\n", ws.Ignored)
	default:
		fmt.Fprintf(w, "  working set: %s in %d ranges, %d blocks, touched over %s (stopped by %s): %s\n",
			units.FormatSize(ws.Bytes), ws.Ranges, ws.Blocks, time.Duration(ws.Span*float64(time.Second)).Round(time.Millisecond), ws.Stop, ws.File)
	}
}

// shellQuote quotes s for a shell command line when it needs quoting.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+=:,@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
