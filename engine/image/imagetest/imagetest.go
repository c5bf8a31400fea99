// Package imagetest builds synthetic snapshots, with memory generated from a
// seed so that tests know every byte a mount must serve without holding
// it: the tests of package fs and of its users (snapctl restore --lazy, the
// end-to-end tests) mount them and compare, and the stores' tests (an
// archive) read them back.
//
// Content is generated page by page from (seed, page address, kind), so
// Fill reproduces any range, at any offset, without reading the snapshot.
package imagetest

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

// PageSize is the page size of every snapshot.
const PageSize = image.PageSize

// Content is the kind of memory a VMA holds.
type Content int

// Contents. The block rule (ZERO, else LZ4 if it saves more than 12.5%,
// else RAW) turns Zero into ZERO blocks, Text into LZ4 blocks and Random
// and BF16 into RAW blocks.
const (
	Zero   Content = iota
	Random         // incompressible
	BF16           // 16-bit weights: random low byte, high byte in a narrow range
	Text           // compressible text; every page starts with Marker
	// Mixed picks, per MiB of address space, Zero (1/4), Random (1/4) or
	// BF16 (1/2): the model-server memory of the benchmarks.
	Mixed
	// Patchwork picks one of Zero, Random, BF16 and Text per 16 KiB, so
	// that blocks of every size mix kinds.
	Patchwork
)

// Marker starts every page of Text content, followed by the pid and the
// page address in hex ("LAZYFS-MARKER pid=42 addr=0x7f0000001000;").
const Marker = "LAZYFS-MARKER"

// VMA is one mapping of a synthetic process.
type VMA struct {
	Start, End uint64 // page aligned
	Prot       int    // PROT_* bits
	Shared     bool
	Kind       string // image.VMA* kind; empty means image.VMAAnon
	Name       string
	Content    Content
	// Holes are [lo, hi) offsets from Start, page aligned, whose pages are
	// not dumped (never touched, or swapped out of the dump).
	Holes [][2]uint64
	// NotDumped lists the VMA in the state without dumping it (as a
	// clean file mapping is).
	NotDumped bool
	// File and Offset, for a file mapping, name the mapped file and the
	// offset of Start in it.
	File   *image.FileID
	Offset uint64
	// VMFlags are the smaps VmFlags mnemonics of the state.
	VMFlags []string
}

// Process is one synthetic process.
type Process struct {
	PID  int
	Seed uint64
	VMAs []VMA // sorted by address, not overlapping
	// Threads and Auxv, if set, are written into the state as they are.
	Threads []image.Thread
	Auxv    []uint64
}

// Snapshot is a written synthetic snapshot.
type Snapshot struct {
	Dir   string
	Procs []Process
}

// Write creates a complete snapshot of procs in dir with the encoding
// options opts.
func Write(dir string, opts image.Options, procs ...Process) (*Snapshot, error) {
	w, err := image.Create(dir, opts)
	if err != nil {
		return nil, err
	}
	defer w.Abort()
	s := &Snapshot{Dir: dir, Procs: procs}
	for _, p := range procs {
		if err := writeProcess(w, &p); err != nil {
			return nil, fmt.Errorf("process %d: %w", p.PID, err)
		}
	}
	if err := w.Commit(); err != nil {
		return nil, err
	}
	return s, nil
}

func writeProcess(w *image.Writer, p *Process) error {
	pw, err := w.Pages(context.Background(), p.PID)
	if err != nil {
		return err
	}
	st := &image.Process{PID: p.PID, Comm: "synthetic", Cmdline: []string{"synthetic", fmt.Sprint(p.PID)}, Threads: p.Threads}
	if len(st.Threads) == 0 {
		// A process has at least its leader (image.Process.Validate).
		st.Threads = []image.Thread{{TID: p.PID, Comm: "synthetic"}}
	}
	st.MM.Auxv = p.Auxv
	for _, v := range p.VMAs {
		if v.Start%PageSize != 0 || v.End%PageSize != 0 || v.End <= v.Start {
			pw.Close()
			return fmt.Errorf("vma %#x-%#x: not page aligned", v.Start, v.End)
		}
		st.VMAs = append(st.VMAs, v.state())
		if v.NotDumped {
			continue
		}
		pw.Break()
		for _, r := range v.dumped() {
			err := pw.Add(r[0], r[1]-r[0], func(dst []byte, addr uint64) error {
				fill(p, &v, dst, addr)
				return nil
			})
			if err != nil {
				pw.Close()
				return err
			}
		}
	}
	if err := pw.Close(); err != nil {
		return err
	}
	return w.WriteState(st)
}

// state returns the process-state record of v.
func (v *VMA) state() image.VMA {
	kind := v.Kind
	if kind == "" {
		kind = image.VMAAnon
	}
	flags := unix.MAP_PRIVATE
	if v.Shared {
		flags = unix.MAP_SHARED
	}
	return image.VMA{Start: v.Start, End: v.End, Prot: v.Prot, Flags: flags, Kind: kind, Name: v.Name, Dumped: !v.NotDumped,
		File: v.File, Offset: v.Offset, VMFlags: v.VMFlags}
}

// dumped returns the dumped address ranges of v: the VMA minus its holes.
func (v *VMA) dumped() [][2]uint64 {
	if v.NotDumped {
		return nil
	}
	holes := slices.Clone(v.Holes)
	slices.SortFunc(holes, func(a, b [2]uint64) int { return int(a[0]>>12) - int(b[0]>>12) })
	var out [][2]uint64
	a := v.Start
	for _, h := range holes {
		lo, hi := v.Start+h[0], v.Start+h[1]
		if lo > a {
			out = append(out, [2]uint64{a, min(lo, v.End)})
		}
		a = max(a, hi)
	}
	if a < v.End {
		out = append(out, [2]uint64{a, v.End})
	}
	return out
}

// Dumped returns the dumped address ranges of pid, in order (ranges of
// adjacent VMAs are merged, as lseek SEEK_DATA/SEEK_HOLE see them).
func (s *Snapshot) Dumped(pid int) [][2]uint64 {
	var out [][2]uint64
	for _, v := range s.proc(pid).VMAs {
		for _, r := range v.dumped() {
			if n := len(out); n > 0 && out[n-1][1] == r[0] {
				out[n-1][1] = r[1]
				continue
			}
			out = append(out, r)
		}
	}
	return out
}

// DumpedBytes returns how many bytes of pid were dumped.
func (s *Snapshot) DumpedBytes(pid int) uint64 {
	var n uint64
	for _, r := range s.Dumped(pid) {
		n += r[1] - r[0]
	}
	return n
}

func (s *Snapshot) proc(pid int) *Process {
	for i := range s.Procs {
		if s.Procs[i].PID == pid {
			return &s.Procs[i]
		}
	}
	panic(fmt.Sprintf("imagetest: no process %d", pid))
}

// Fill writes into dst the memory the snapshot holds for pid at addr:
// zeros where nothing was dumped.
func (s *Snapshot) Fill(pid int, dst []byte, addr uint64) {
	clear(dst)
	p := s.proc(pid)
	end := addr + uint64(len(dst))
	for i := range p.VMAs {
		v := &p.VMAs[i]
		for _, r := range v.dumped() {
			lo, hi := max(addr, r[0]), min(end, r[1])
			if lo < hi {
				fill(p, v, dst[lo-addr:hi-addr], lo)
			}
		}
	}
}

// Memory returns the memory of pid in [addr, addr+n).
func (s *Snapshot) Memory(pid int, addr uint64, n int) []byte {
	b := make([]byte, n)
	s.Fill(pid, b, addr)
	return b
}

// fill generates the content of v at [addr, addr+len(dst)), which lies in
// a dumped range of v.
func fill(p *Process, v *VMA, dst []byte, addr uint64) {
	var page [PageSize]byte
	for len(dst) > 0 {
		pa := addr &^ (PageSize - 1)
		genPage(p, v.Content, pa, page[:])
		n := copy(dst, page[addr-pa:])
		dst = dst[n:]
		addr += uint64(n)
	}
}

// genPage writes the page at address pa.
func genPage(p *Process, c Content, pa uint64, page []byte) {
	switch c {
	case Mixed:
		switch mix(p.Seed^0x6d69786564, pa>>20) % 4 {
		case 0:
			c = Zero
		case 1:
			c = Random
		default:
			c = BF16
		}
	case Patchwork:
		c = []Content{Zero, Random, BF16, Text}[mix(p.Seed^0x7061746368, pa>>14)%4]
	}
	x := mix(p.Seed, pa)
	switch c {
	case Zero:
		clear(page)
	case Random:
		for i := 0; i < len(page); i += 8 {
			x = splitmix(x)
			binary.LittleEndian.PutUint64(page[i:], x)
		}
	case BF16:
		for i := 0; i < len(page); i += 8 {
			x = splitmix(x)
			for j := 0; j < 8; j += 2 {
				page[i+j] = byte(x >> (8 * j))
				page[i+j+1] = 0x3c + byte(x>>(8*j+8))&3
			}
		}
	case Text:
		genText(p.PID, pa, x, page)
	default:
		panic(fmt.Sprintf("imagetest: content %d", c))
	}
}

var words = []string{"alpha ", "bravo ", "charlie ", "delta ", "echo ", "foxtrot ", "golf ", "hotel ", "india ", "juliet ", "kilo ", "lima ", "mike ", "november ", "oscar ", "papa "}

// genText writes a compressible page that starts with Marker.
func genText(pid int, pa, x uint64, page []byte) {
	n := copy(page, fmt.Sprintf("%s pid=%d addr=%#x;\n", Marker, pid, pa))
	for n < len(page) {
		x = splitmix(x)
		n += copy(page[n:], words[x%uint64(len(words))])
	}
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	z := x
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func mix(seed, v uint64) uint64 { return splitmix(seed ^ splitmix(v)) }

// MappedFile writes a file of n bytes of content generated from seed in
// dir and returns its identity as a dump records it (a mapped file's
// VMA.File), and its bytes.
func MappedFile(t testing.TB, dir string, seed uint64, n int) (image.FileID, []byte) {
	t.Helper()
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(seed, 7))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	path := filepath.Join(dir, fmt.Sprintf("mapped-%d.so", seed))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return image.FileID{Path: path, Dev: st.Dev, Ino: st.Ino, Size: st.Size, MtimeNs: st.Mtim.Nano(), Mode: st.Mode}, b
}
