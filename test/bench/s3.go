package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/lazyfs/lazyfs/engine/image/store"
	"github.com/lazyfs/lazyfs/engine/image/store/s3"
	"github.com/lazyfs/lazyfs/engine/units"
	"github.com/lazyfs/lazyfs/test/bench/harness"
	"github.com/lazyfs/lazyfs/test/bench/measure"
	"github.com/lazyfs/lazyfs/test/bench/report"
)

// The "s3" series: the modelserver dumped to a MinIO server on loopback
// and to the disk, and restored lazily (through the private mount) from
// each: from the disk, from the store, and from the store with a filled
// --cache-dir; and the pages file alone written to and read from the
// store, the floor of both.

func init() {
	harness.ExtraSeries = append(harness.ExtraSeries, harness.Series{Name: "s3", Measure: measureS3})
}

func measureS3(ctx context.Context, h *harness.Harness, sr *report.SizeResult) error {
	if !h.Wants("s3") {
		return nil
	}
	dir := filepath.Join(h.Work, "minio")
	m, err := measure.StartMinIO(ctx, dir, filepath.Join(h.Work, "minio.log"))
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	defer m.Stop()
	defer measure.S3Env(m)()
	def := report.DefaultConfig()
	res := &report.S3Result{DumpDisk: &report.DumpResult{Config: def}, DumpStore: &report.DumpResult{Config: def}}
	for _, from := range report.S3Sources {
		res.Restores = append(res.Restores, &report.S3Restore{From: from, RestoreResult: report.RestoreResult{Config: def, Case: report.RestoreCase{Mode: report.LazyMount, Threads: report.DefThreads}}})
	}
	diskDir := filepath.Join(h.Work, "snap-s3-disk")
	defer os.RemoveAll(diskDir)
	var disk, store *harness.Snapshot
	// Dumps, the two targets back to back, alternating.
	for r := range h.Runs {
		for i := range 2 {
			if (i+r)%2 == 0 {
				os.RemoveAll(diskDir)
				if disk, err = h.DumpOnce(ctx, sr, def, diskDir, res.DumpDisk); err != nil {
					return fmt.Errorf("dump to disk: %w", err)
				}
			} else if store, err = dumpStore(ctx, h, fmt.Sprintf("s3://%s/run-%d", measure.S3Bucket, r), def, res.DumpStore); err != nil {
				return fmt.Errorf("dump to MinIO: %w", err)
			}
		}
		h.Logf("s3 dump run %d/%d: disk %s (frozen %s), MinIO %s (frozen %s)", r+1, h.Runs,
			harness.Millis(res.DumpDisk.Total[r]), harness.Millis(res.DumpDisk.Freeze[r]), harness.Millis(res.DumpStore.Total[r]), harness.Millis(res.DumpStore.Freeze[r]))
	}
	res.Pages = res.DumpDisk.Pages
	// The cache directory, filled once by a verify, which reads every
	// block.
	cacheDir := filepath.Join(h.Work, "s3-cache")
	defer os.RemoveAll(cacheDir)
	if out, err := exec.CommandContext(ctx, h.Tools.Snapctl, "verify", "-D", store.Dir, "--cache-dir", cacheDir).CombinedOutput(); err != nil {
		return fmt.Errorf("verify to fill the cache directory: %w\n%s", err, out)
	}
	files, err := measure.SnapshotFiles(disk.Dir)
	if err != nil {
		return err
	}
	defer func() { h.RestoreArgs = nil }()
	for r := range h.Runs {
		for i, x := range res.Restores {
			snap, fs := disk, files
			h.RestoreArgs = nil
			if i > 0 {
				snap, fs = store, nil
			}
			if i == 2 {
				h.RestoreArgs = []string{"--cache-dir", cacheDir}
			}
			run, err := h.RestoreOnce(ctx, snap, fs, x.Case)
			if err != nil {
				return fmt.Errorf("lazy restore from %s: %w", x.From, err)
			}
			x.Runs = append(x.Runs, run)
			h.Logf("s3 restore from %-26s run %d/%d: runs %s, ping %s, touch 1 %s, token %s, all in %s", x.From, r+1, h.Runs,
				harness.Millis(run.Running), harness.Millis(run.Ping), harness.Millis(run.First), harness.Millis(run.Token), harness.Millis(run.Total))
		}
	}
	// The floor: the pages file alone.
	for r := range h.Runs {
		put, get, read, err := pagesAlone(disk, fmt.Sprintf("s3://%s/floor-%d", measure.S3Bucket, r))
		if err != nil {
			return fmt.Errorf("pages file alone: %w", err)
		}
		res.Put, res.Get, res.DiskRead = append(res.Put, put), append(res.Get, get), append(res.DiskRead, read)
		h.Logf("s3 pages file alone run %d/%d: %s up %s, down %s; disk read (warm) %s", r+1, h.Runs, units.FormatSize(res.Pages), harness.Millis(put), harness.Millis(get), harness.Millis(read))
	}
	sr.S3 = res
	return nil
}

// dumpStore starts a server and dumps it to the address addr.
func dumpStore(ctx context.Context, h *harness.Harness, addr string, cfg report.DumpConfig, dr *report.DumpResult) (*harness.Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, h.OpTimeout())
	defer cancel()
	srv, err := measure.StartServer(ctx, h.Tools, h.Tools.Modelserver, h.Size, nil, h.LogPath, h.Work)
	if err != nil {
		return nil, err
	}
	h.Live = srv.PID
	if h.Expect == (harness.Expectation{}) {
		if err := h.Learn(ctx, srv.Port); err != nil {
			return nil, err
		}
	}
	args := append([]string{"dump", "-t", strconv.Itoa(srv.PID), "-D", addr}, cfg.Args...)
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, h.Tools.Snapctl, args...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = &out, &errOut, h.Work
	start := time.Now()
	err = cmd.Run()
	wall := time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("snapctl %q: %w\n%s%s", args, err, out.String(), errOut.String())
	}
	if err := srv.WaitGone(ctx); err != nil {
		return nil, err
	}
	h.Live = 0
	rep, err := measure.ParseDump(out.String())
	if err != nil {
		return nil, err
	}
	dr.Wall = append(dr.Wall, wall)
	dr.Total = append(dr.Total, rep.Total)
	dr.Freeze = append(dr.Freeze, rep.Freeze)
	dr.Ratio = rep.Ratio
	return &harness.Snapshot{Dir: addr, PID: srv.PID, Port: srv.Port}, nil
}

// pagesAlone uploads the pages file of disk to addr as a dump does
// (store/s3, parallel parts), reads it back as a restore's sequential
// reader does, and reads it from the disk (warm), timing each.
func pagesAlone(disk *harness.Snapshot, addr string) (put, get, read time.Duration, err error) {
	start := time.Now()
	b, err := os.ReadFile(disk.Pages)
	if err != nil {
		return 0, 0, 0, err
	}
	read = time.Since(start)
	name := filepath.Base(disk.Pages)
	start = time.Now()
	w, err := s3.Create(addr, store.Options{})
	if err != nil {
		return 0, 0, 0, err
	}
	defer w.Abort() // removes the floor's objects
	u, _ := w.Create(name)
	for off := 0; off < len(b); off += 4 << 20 {
		if _, err := u.Write(b[off:min(len(b), off+4<<20)]); err != nil {
			return 0, 0, 0, err
		}
	}
	if err := u.Close(); err != nil {
		return 0, 0, 0, err
	}
	put = time.Since(start)
	if err := w.Commit([]byte("{}\n")); err != nil {
		return 0, 0, 0, err
	}
	start = time.Now()
	s, err := s3.Open(addr, store.Options{})
	if err != nil {
		return 0, 0, 0, err
	}
	f, err := s.Open(name)
	if err != nil {
		return 0, 0, 0, err
	}
	defer f.Close()
	got := make([]byte, 1<<20)
	for off := 0; off < len(b); off += len(got) {
		n, err := f.ReadAt(got, int64(off))
		if err != nil && !(errors.Is(err, io.EOF) && off+n == len(b)) {
			return 0, 0, 0, err
		}
		if !bytes.Equal(got[:n], b[off:off+n]) {
			return 0, 0, 0, fmt.Errorf("%s at %d: the store gave other bytes: %w", addr, off, report.ErrInsane)
		}
	}
	get = time.Since(start)
	return put, get, read, nil
}
