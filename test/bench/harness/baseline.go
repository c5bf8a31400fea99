package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/test/bench/measure"
	"github.com/lazyfs/lazyfs/test/bench/report"
)

// mountTimeout bounds the start and the stop of the lazyfs mount that
// extracts the raw memory.
const mountTimeout = 30 * time.Second

// baselines times, cold and warm, reading the pages file of snap to
// /dev/null and, for a configuration with LZ4 blocks, the lz4 tool
// decompressing the raw memory cut into blocks of the same size.
func (h *Harness) baselines(ctx context.Context, snap *Snapshot, cfg report.DumpConfig, raw string, memory uint64, dr *report.DumpResult) ([]*report.BaselineResult, error) {
	read := &report.BaselineResult{Config: cfg, Kind: report.ReadPages, Bytes: dr.Pages}
	if err := h.timeBaseline(ctx, read, snap.Pages, h.Tools.Cat, snap.Pages); err != nil {
		return nil, err
	}
	out := []*report.BaselineResult{read}
	if !cfg.Compress {
		return out, nil
	}
	kinds := []report.BaselineKind{report.LZ4Decode}
	if cfg.Default {
		kinds = append(kinds, report.LZ4Checked)
	}
	for _, k := range kinds {
		b, err := h.lz4Baseline(ctx, cfg, k, raw, memory)
		if err != nil {
			return nil, err
		}
		if k == report.LZ4Decode {
			dr.LZ4 = b.Bytes
		}
		out = append(out, b)
	}
	return out, nil
}

// lz4Baseline compresses the raw memory with the lz4 tool in blocks of the
// configuration's size and times decompressing it.
func (h *Harness) lz4Baseline(ctx context.Context, cfg report.DumpConfig, k report.BaselineKind, raw string, memory uint64) (*report.BaselineResult, error) {
	lz := filepath.Join(h.Work, "memory-"+cfg.Short+".lz4")
	defer os.Remove(lz)
	ctx2, cancel := context.WithTimeout(ctx, h.OpTimeout())
	defer cancel()
	// -1: the fast level; -BI: independent blocks, like snapshot blocks;
	// -B<bytes>: cut the input into blocks of exactly this size.
	args := []string{"-q", "-f", "-1", "-BI", "-B" + strconv.FormatInt(cfg.Block, 10)}
	if k == report.LZ4Decode {
		args = append(args, "--no-frame-crc")
	}
	c := exec.CommandContext(ctx2, h.Tools.LZ4, append(args, raw, lz)...)
	if b, err := c.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("lz4 compress: %w\n%s", err, b)
	}
	st, err := os.Stat(lz)
	if err != nil {
		return nil, fmt.Errorf("lz4 file: %w", err)
	}
	b := &report.BaselineResult{Config: cfg, Kind: k, Bytes: uint64(st.Size()), Output: memory}
	if err := h.timeBaseline(ctx, b, lz, h.Tools.LZ4, "-d", "-c", lz); err != nil {
		return nil, err
	}
	return b, nil
}

// timeBaseline runs name args with stdout on /dev/null h.Runs times cold
// and warm (interleaved) and records the wall times in b.
func (h *Harness) timeBaseline(ctx context.Context, b *report.BaselineResult, file, name string, args ...string) error {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer null.Close()
	for r := range h.Runs {
		for _, cold := range []bool{true, false} {
			if err := measure.SetCache(cold, file); err != nil {
				return err
			}
			ctx2, cancel := context.WithTimeout(ctx, h.OpTimeout())
			var errOut bytes.Buffer
			cmd := exec.CommandContext(ctx2, name, args...)
			cmd.Stdout, cmd.Stderr = null, &errOut
			start := time.Now()
			err := cmd.Run()
			d := time.Since(start)
			cancel()
			if err != nil {
				return fmt.Errorf("%s %q: %w\n%s", name, args, err, errOut.String())
			}
			if cold {
				b.Cold = append(b.Cold, d)
			} else {
				b.Warm = append(b.Warm, d)
			}
			h.Logf("baseline %-5s %s %s run %d/%d: %s", b.Config.Short, filepath.Base(name), map[bool]string{true: "cold", false: "warm"}[cold], r+1, h.Runs, Millis(d))
		}
	}
	return nil
}

// rawMemory mounts snap with lazyfs and copies the data of its mem file
// (every dumped page, holes skipped) into one file: the bytes a restore
// puts back into the process, for the lz4 baseline.
func (h *Harness) rawMemory(ctx context.Context, snap *Snapshot) (string, uint64, error) {
	mnt := filepath.Join(h.Work, "mnt")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return "", 0, err
	}
	var errOut bytes.Buffer
	cmd := exec.Command(h.Tools.Lazyfs, snap.Dir, mnt)
	cmd.Stdout, cmd.Stderr = &errOut, &errOut
	if err := cmd.Start(); err != nil {
		return "", 0, fmt.Errorf("start lazyfs: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer h.unmount(cmd, exited, mnt)

	ready, cancel := context.WithTimeout(ctx, mountTimeout)
	defer cancel()
	for {
		if _, err := os.Stat(filepath.Join(mnt, image.ManifestName)); err == nil {
			break
		}
		select {
		case err := <-exited:
			exited <- err
			return "", 0, fmt.Errorf("lazyfs exited: %v\n%s", err, errOut.String())
		case <-ready.Done():
			return "", 0, fmt.Errorf("wait for the lazyfs mount: %w", ready.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	raw := filepath.Join(h.Work, "memory.raw")
	n, err := measure.CopyData(filepath.Join(mnt, strconv.Itoa(snap.PID), "mem"), raw)
	if err != nil {
		os.Remove(raw)
		return "", 0, err
	}
	return raw, n, nil
}

// unmount stops the lazyfs process (a clean unmount on SIGTERM), or
// forces the unmount if it does not stop in time.
func (h *Harness) unmount(cmd *exec.Cmd, exited chan error, mnt string) {
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(mountTimeout):
		cmd.Process.Kill()
		<-exited
	}
	if measure.Mounted(mnt) {
		ctx, cancel := context.WithTimeout(context.Background(), mountTimeout)
		defer cancel()
		if b, err := exec.CommandContext(ctx, h.Tools.Lazyfs, "-u", "--force", mnt).CombinedOutput(); err != nil {
			fmt.Fprintf(h.Log, "bench: unmount %s: %v\n%s", mnt, err, b)
		}
	}
	os.Remove(mnt)
}
