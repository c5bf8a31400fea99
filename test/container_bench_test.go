package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/test/fixture/container"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// BenchmarkContainerFirstAnswer: redis with 200,000 keys in a runc
// container (the server a child of the container's init), dumped, and
// restored into a fresh container of the same root file system, timed
// from the start of the restore command to the first answer of a GET
// asked in the new container's network namespace:
//
//   - snapctl-eager, snapctl-lazy: snapctl restore --into, the fresh
//     container's placeholder already running (its start is timed apart:
//     placeholder-start);
//   - runc-criu: runc restore of a CRIU checkpoint (runc checkpoint) of
//     the same container, which makes the container too; criu is $CRIU,
//     else criu on PATH, and runs only if `criu check` passes.
//
// Run it with:
//
//	go test -run '^$' -bench BenchmarkContainerFirstAnswer -benchtime 5x ./test/
//
// Each reports the median (median-ms) besides the mean (ns/op).
func BenchmarkContainerFirstAnswer(b *testing.B) {
	testutil.RequirePtrace(b)
	testutil.RequireCommand(b, "runc", "nsenter", "busybox")
	testutil.RequireKernel(b, "setns of a pidfd (restore --into)", probeSetnsPidfd())
	redisServer := testutil.RequireCommand(b, "redis-server")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	const keys = 200_000
	rootfs := container.Rootfs(b, redisServer)
	serve := fmt.Sprintf("%s --port 6379 --bind 127.0.0.1 --save '' --appendonly no --dir /tmp </dev/null >/dev/null 2>&1 & exec /bin/sleep infinity </dev/null >/dev/null 2>&1", redisServer)
	filled := func() *container.Container {
		c := container.Start(b, container.Spec{Rootfs: rootfs, Args: []string{"/bin/sh", "-c", serve}})
		if err := waitGet(ctx, c.InitPID, time.Minute, false); err != nil {
			b.Fatal(err)
		}
		if err := c.InNetns(func() error { return redisLoad(ctx, 6379, keys) }); err != nil {
			b.Fatal(err)
		}
		return c
	}
	a := filled()
	var server int
	pids, _ := a.Pids()
	for _, p := range pids {
		if p != a.InitPID {
			server = p
		}
	}
	dir := filepath.Join(b.TempDir(), "snap")
	dumpPID(b, server, dir)

	run := func(b *testing.B, one func() time.Duration) {
		var times []time.Duration
		for b.Loop() {
			times = append(times, one())
		}
		slices.Sort(times)
		b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "median-ms")
	}
	for _, mode := range []string{"eager", "lazy"} {
		b.Run("snapctl-"+mode, func(b *testing.B) {
			run(b, func() time.Duration {
				b.StopTimer()
				c := container.Start(b, container.Spec{Rootfs: rootfs, Args: container.PlaceholderArgs()})
				args := []string{"restore", "-D", dir, "--into", strconv.Itoa(c.InitPID)}
				if mode == "lazy" {
					args = append(args, "--lazy")
				}
				cmd := exec.CommandContext(ctx, buildTool(b, "snapctl"), args...)
				b.StartTimer()
				start := time.Now()
				if err := cmd.Start(); err != nil {
					b.Fatal(err)
				}
				if err := waitGet(ctx, c.InitPID, time.Minute, true); err != nil {
					b.Fatal(err)
				}
				took := time.Since(start)
				b.StopTimer()
				if err := cmd.Wait(); err != nil {
					b.Fatalf("snapctl %v: %v", args, err)
				}
				if err := c.Stop(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				return took
			})
		})
	}
	b.Run("placeholder-start", func(b *testing.B) {
		run(b, func() time.Duration {
			start := time.Now()
			c := container.Start(b, container.Spec{Rootfs: rootfs, Args: container.PlaceholderArgs()})
			took := time.Since(start)
			b.StopTimer()
			c.Stop()
			b.StartTimer()
			return took
		})
	})

	criu := os.Getenv("CRIU")
	if criu == "" {
		criu, _ = exec.LookPath("criu")
	}
	if criu == "" {
		b.Log("runc-criu: no criu")
		return
	}
	if out, err := exec.CommandContext(ctx, criu, "check").CombinedOutput(); err != nil {
		b.Logf("runc-criu: %s check fails here: %v: %s", criu, err, strings.TrimSpace(string(out)))
		return
	}
	c := filled()
	img := filepath.Join(b.TempDir(), "criu")
	if out, err := c.Runc(ctx, "--criu", criu, "checkpoint", "--image-path", img, c.ID); err != nil {
		b.Logf("runc-criu: runc checkpoint: %v %s", err, out)
		return
	}
	n := 0
	b.Run("runc-criu", func(b *testing.B) {
		run(b, func() time.Duration {
			n++
			id := fmt.Sprintf("%s-restored-%d", c.ID, n)
			gone := func() {
				c.Runc(ctx, "kill", id, "KILL")
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
					if _, err := c.Runc(ctx, "delete", "--force", id); err == nil {
						return
					}
				}
			}
			b.Cleanup(gone) // also if this round fails
			start := time.Now()
			out, err := c.Runc(ctx, "--criu", criu, "restore", "-d", "--image-path", img, "--bundle", c.Bundle, id)
			if err != nil {
				b.Fatalf("runc restore: %v %s", err, out)
			}
			st, err := c.Runc(ctx, "state", id)
			var state struct{ Pid int }
			if err == nil {
				err = json.Unmarshal(st, &state)
			}
			if err != nil {
				b.Fatal(err)
			}
			// runc restore leaves the container's loopback down (runc
			// makes the network namespace, criu finds no image of it):
			// up, as a runtime's network setup would, within the time.
			if out, err := exec.CommandContext(ctx, "nsenter", "-t", strconv.Itoa(state.Pid), "-n", "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
				b.Fatalf("loopback up in the restored container: %v %s", err, out)
			}
			if err := waitGet(ctx, state.Pid, time.Minute, true); err != nil {
				b.Fatal(err)
			}
			took := time.Since(start)
			b.StopTimer()
			gone()
			b.StartTimer()
			return took
		})
	})
}

// waitGet asks GET key:000000 of the redis in the network namespace of
// pid until it answers, with the key's value if value, for at most wait.
func waitGet(ctx context.Context, pid int, wait time.Duration, value bool) error {
	deadline := time.Now().Add(wait)
	want := redisValue(0)
	return container.InNetnsOf(pid, func() error {
		for {
			c, err := net.DialTimeout("tcp", "127.0.0.1:6379", time.Second)
			if err == nil {
				c.SetDeadline(time.Now().Add(5 * time.Second))
				fmt.Fprintf(c, "GET %s\r\n", redisKey(0))
				r := bufio.NewReader(c)
				line, _ := r.ReadString('\n')
				val, _ := r.ReadString('\n')
				c.Close()
				if strings.HasPrefix(line, "$") && (!value || strings.TrimSpace(val) == want) {
					return nil
				}
				if value && (strings.HasPrefix(line, "$-1") || strings.HasPrefix(line, "-")) {
					return fmt.Errorf("GET %s answered %q", redisKey(0), line)
				}
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("redis in the network namespace of %d: no answer within %v (%v)", pid, wait, err)
			}
			time.Sleep(500 * time.Microsecond)
		}
	})
}
