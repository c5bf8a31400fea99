package e2e

// Containers: redis in a runc container (its own pid, mount, network,
// IPC and UTS namespaces and cgroups), filled, dumped, and restored into
// fresh containers of the same root file system (each a placeholder
// init, as a runtime makes it), eagerly and lazily: the data answered by
// a client in the new container's network namespace, the process in the
// new container's namespaces and cgroup with the pid it had in the old
// one. A container whose root lacks a file the process needs is refused,
// naming the file, and so is a restore outside any container.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/fixture/container"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// restoreIntoFresh restores the snapshot in dir into a fresh container
// of rootfs (its init a placeholder), eagerly then lazily, each a subtest
// that hands check the container and snapctl's result, then stops the
// container and checks that nothing of it is left.
func restoreIntoFresh(t *testing.T, rootfs, dir string, check func(t *testing.T, mode string, b *container.Container, r cmdResult)) {
	t.Helper()
	for _, c := range []struct {
		name  string
		flags []string
	}{
		{"eager", nil},
		{"lazy", []string{"--lazy"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := container.Start(t, container.Spec{Rootfs: rootfs, Args: container.PlaceholderArgs()})
			r := mustSnapctl(t, append([]string{"restore", "-D", dir, "--into", strconv.Itoa(b.InitPID)}, c.flags...)...)
			t.Logf("%s", strings.TrimSpace(r.Stdout))
			check(t, c.name, b, r)
			stopContainer(t, b)
		})
	}
}

// probeSetnsPidfd is what restore --into needs of the kernel: setns of a
// pidfd (Linux 5.8), tried on our own network namespace on a thread
// that ends with the probe.
func probeSetnsPidfd() error {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		done <- unix.Setns(fd, unix.CLONE_NEWNET)
	}()
	return <-done
}

// containerChild returns the host pid of the one process of c that is
// not its init.
func containerChild(t *testing.T, c *container.Container) int {
	t.Helper()
	pids, err := c.Pids()
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, p := range pids {
		if p != c.InitPID {
			out = append(out, p)
		}
	}
	if len(out) != 1 {
		t.Fatalf("container %s: processes %v besides its init %d, want one", c.ID, out, c.InitPID)
	}
	return out[0]
}

func TestContainerRedis(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	testutil.RequireCommand(t, "runc", "nsenter", "busybox")
	testutil.RequireKernel(t, "setns of a pidfd (restore --into)", probeSetnsPidfd())
	redisServer := testutil.RequireCommand(t, "redis-server")
	ctx := testContext(t)
	rootfs := container.Rootfs(t, redisServer)

	// The server a child of the container's init, as under an init
	// shim: the init stays the namespace's pid 1, which a restore into
	// another container cannot give. Its standard streams are the
	// container's /dev/null, not the runtime's log outside.
	serve := fmt.Sprintf("%s --port 6379 --bind 127.0.0.1 --save '' --appendonly no --dir /tmp </dev/null >/dev/null 2>&1 & exec /bin/sleep infinity", redisServer)
	a := container.Start(t, container.Spec{Rootfs: rootfs, Args: []string{"/bin/sh", "-c", serve}})
	pingContainer(t, a)
	const keys = 20_000
	if err := a.InNetns(func() error { return redisLoad(ctx, 6379, keys) }); err != nil {
		t.Fatal(err)
	}
	pid := containerChild(t, a)
	st, err := proc.ReadStatus(pid)
	if err != nil {
		t.Fatal(err)
	}
	own := st.NSpid[len(st.NSpid)-1]
	dir := filepath.Join(t.TempDir(), "snap")
	r := dumpPID(t, pid, dir)
	t.Logf("%s", strings.TrimSpace(r.Stdout))
	si := openImage(t, dir, pid)
	if !slices.Equal(si.State.NSPID, st.NSpid) || !slices.Contains(si.State.Namespaces, "mnt") || !slices.Contains(si.State.Namespaces, "net") || len(si.State.Cgroups) == 0 {
		t.Errorf("snapshot of a container's process: ns_pid %v (want %v), namespaces %v, cgroups %v", si.State.NSPID, st.NSpid, si.State.Namespaces, si.State.Cgroups)
	}

	// Outside a container: refused, saying where it belongs.
	if r := runSnapctl(t, "restore", "-D", dir); r.Code == 0 || !strings.Contains(r.Stderr, "--into") {
		t.Errorf("restore of a container's process outside any: want a refusal naming --into\n%s", r)
	}

	restoreIntoFresh(t, rootfs, dir, func(t *testing.T, mode string, b *container.Container, r cmdResult) {
		got := containerChild(t, b)
		if !strings.Contains(r.Stdout, fmt.Sprintf("pid %d is pid %d in the pid namespace it joined", got, own)) {
			t.Errorf("restore output does not say pid %d is %d in the container:\n%s", got, own, r.Stdout)
		}
		for _, ns := range []string{"pid", "net", "mnt", "ipc", "uts", "cgroup"} {
			if nsOf(t, got, ns) != nsOf(t, b.InitPID, ns) {
				t.Errorf("restored pid %d is not in the container's %s namespace", got, ns)
			}
		}
		if cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", got)); !strings.Contains(string(cg), b.ID) {
			t.Errorf("restored pid %d is not in the container's cgroups:\n%s", got, cg)
		}
		if s, err := proc.ReadStatus(got); err != nil || s.NSpid[len(s.NSpid)-1] != own {
			t.Errorf("restored pid %d: NSpid %v, want %d inside", got, s.NSpid, own)
		}
		if err := b.InNetns(func() error { return redisSample(ctx, 6379, keys, 97) }); err != nil {
			t.Errorf("the data in the new container: %v", err)
		}
		if mode == "eager" {
			// Once more into the same container: its pid is taken there.
			r := runSnapctl(t, "restore", "-D", dir, "--into", strconv.Itoa(b.InitPID))
			if want := fmt.Sprintf("pid %d is taken by", own); r.Code != 5 || !strings.Contains(r.Stderr, want) {
				t.Errorf("a second restore into one container: want exit 5 saying %q\n%s", want, r)
			}
		}
		if err := b.InNetns(func() error {
			v, err := fixture.Redis(ctx, 6379, "SET", "after", "restore")
			if err == nil && v != "OK" {
				err = fmt.Errorf("SET answered %q", v)
			}
			return err
		}); err != nil {
			t.Errorf("a write after the restore: %v", err)
		}
	})

	// A container whose root file system lacks the server: refused,
	// naming it, before anything is made.
	exe, err := filepath.EvalSymlinks(redisServer) // redis-server is a link to redis-check-rdb
	if err != nil {
		t.Fatal(err)
	}
	bare := container.Start(t, container.Spec{Rootfs: container.Rootfs(t), Args: container.PlaceholderArgs()})
	r = runSnapctl(t, "restore", "-D", dir, "--into", strconv.Itoa(bare.InitPID))
	if r.Code != exitFileChanged || !strings.Contains(r.Stderr, exe) {
		t.Errorf("restore into a container without %s: want exit %d naming it\n%s", exe, exitFileChanged, r)
	}
	if pids, _ := bare.Pids(); len(pids) != 1 {
		t.Errorf("a refused restore left processes in the container: %v", pids)
	}

	// A root made anew (copied, as another host's or an overlay would be:
	// other devices and inodes, the same sizes and times): restored, the
	// files matched by what the root keeps of them. Then one of them
	// touched: refused, naming it.
	copied := filepath.Join(t.TempDir(), "rootfs")
	if out, err := exec.Command("cp", "-a", rootfs, copied).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v %s", err, out)
	}
	fresh := container.Start(t, container.Spec{Rootfs: copied, Args: container.PlaceholderArgs()})
	r = mustSnapctl(t, "restore", "-D", dir, "--into", strconv.Itoa(fresh.InitPID))
	t.Logf("into a copied root: %s", strings.TrimSpace(r.Stdout))
	if err := fresh.InNetns(func() error { return redisSample(ctx, 6379, keys, 101) }); err != nil {
		t.Errorf("the data in a container of a copied root: %v", err)
	}
	stopContainer(t, fresh)
	if err := os.Chtimes(copied+exe, time.Now(), time.Now()); err != nil {
		t.Fatal(err)
	}
	touched := container.Start(t, container.Spec{Rootfs: copied, Args: container.PlaceholderArgs()})
	r = runSnapctl(t, "restore", "-D", dir, "--into", strconv.Itoa(touched.InitPID))
	if r.Code != exitFileChanged || !strings.Contains(r.Stderr, exe) {
		t.Errorf("restore into a root whose %s changed: want exit %d naming it\n%s", exe, exitFileChanged, r)
	}

	// Into a process in a user namespace of its own: refused (its owner
	// rules its mount namespace).
	unshare := testutil.RequireCommand(t, "unshare")
	u := exec.Command(unshare, "--user", "--map-root-user", "--mount", "--net", "--pid", "--fork", "sleep", "600")
	if err := u.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Process.Kill(); u.Wait() })
	r = runSnapctl(t, "restore", "-D", dir, "--into", strconv.Itoa(u.Process.Pid))
	if r.Code != 3 || !strings.Contains(r.Stderr, "user namespace") {
		t.Errorf("restore into a process in a user namespace: want exit 3 naming it\n%s", r)
	}
}

// containerNginxConf is nginx in a container: its master in the
// foreground (a child of the container's init), two workers as nobody.
const containerNginxConf = `daemon off;
master_process on;
worker_processes 2;
user nobody nogroup;
pid /srv/nginx.pid;
error_log /srv/error.log;
events { worker_connections 64; }
http {
	access_log /srv/access.log;
	client_body_temp_path /srv/tmp;
	proxy_temp_path /srv/tmp;
	fastcgi_temp_path /srv/tmp;
	uwsgi_temp_path /srv/tmp;
	scgi_temp_path /srv/tmp;
	server { listen 127.0.0.1:8080; root /srv/www; }
}
`

// TestContainerNginx: nginx's tree (a master and two workers of another
// uid) in a runc container, dumped and restored into fresh containers of
// the same root file system, eagerly and lazily: the page served in the
// new container, its tree whole there.
func TestContainerNginx(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	testutil.RequireCommand(t, "runc", "nsenter", "busybox")
	testutil.RequireKernel(t, "setns of a pidfd (restore --into)", probeSetnsPidfd())
	nginx := testutil.RequireCommand(t, "nginx")
	ctx := testContext(t)
	rootfs := container.RootfsWith(t, container.RootfsOptions{Programs: []string{nginx},
		Dirs: []string{"/srv", "/srv/www", "/srv/tmp", "/var/log/nginx", "/var/lib/nginx"}})
	page := fmt.Sprintf("served by nginx in a container, %s\n", t.Name())
	for name, b := range map[string]string{"/srv/nginx.conf": containerNginxConf, "/srv/www/index.html": page} {
		if err := os.WriteFile(rootfs+name, []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(rootfs+"/srv/tmp", 0o777)
	get := func(c *container.Container) error {
		return c.InNetns(func() error {
			body, err := httpGetHere(ctx, "http://127.0.0.1:8080/")
			if err == nil && body != page {
				err = fmt.Errorf("GET / answered %q", body)
			}
			return err
		})
	}
	// tree returns the master (the process whose parent is not in the
	// container: its init's child before the dump, the host's after a
	// restore) and its workers (the master's children).
	tree := func(c *container.Container) (master int, workers []int) {
		t.Helper()
		pids, err := c.Pids()
		if err != nil {
			t.Fatal(err)
		}
		parent := map[int]int{}
		for _, p := range pids {
			if st, err := proc.ReadStat(p); err == nil && p != c.InitPID {
				parent[p] = st.PPid
			}
		}
		for p, pp := range parent {
			if _, inside := parent[pp]; !inside {
				master = p
			}
		}
		for p, pp := range parent {
			if pp == master {
				workers = append(workers, p)
			}
		}
		return master, workers
	}
	serve := fmt.Sprintf("%s -c /srv/nginx.conf -p /srv </dev/null >/dev/null 2>&1 & exec /bin/sleep infinity", nginx)
	a := container.Start(t, container.Spec{Rootfs: rootfs, Args: []string{"/bin/sh", "-c", serve}})
	var master int
	for deadline := time.Now().Add(containerWait); ; time.Sleep(20 * time.Millisecond) {
		m, w := tree(a)
		if m != 0 && len(w) == 2 && get(a) == nil {
			master = m
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(rootfs + "/srv/error.log")
			t.Fatalf("nginx in container %s: master %d, workers %v, GET: %v\n%s", a.ID, m, w, get(a), b)
		}
	}
	dir := filepath.Join(t.TempDir(), "snap")
	r := dumpPID(t, master, dir)
	t.Logf("%s", strings.TrimSpace(r.Stdout))

	restoreIntoFresh(t, rootfs, dir, func(t *testing.T, mode string, b *container.Container, r cmdResult) {
		m, w := tree(b)
		if m == 0 || len(w) != 2 {
			t.Fatalf("restored tree in container %s: master %d, workers %v; want a master and two workers", b.ID, m, w)
		}
		for _, p := range w {
			if st, err := proc.ReadStatus(p); err != nil || st.Uid[0] == 0 {
				t.Errorf("worker %d runs as uid %v (%v), want nobody's", p, st.Uid, err)
			}
			if nsOf(t, p, "pid") != nsOf(t, b.InitPID, "pid") || nsOf(t, p, "net") != nsOf(t, b.InitPID, "net") {
				t.Errorf("worker %d is not in the container's namespaces", p)
			}
		}
		for i := range 3 {
			if err := get(b); err != nil {
				t.Errorf("GET %d in the new container: %v", i, err)
			}
		}
	})
}

// TestDumpUserNamespaceRefused: a process in a user namespace of its own
// (a rootless container's) is refused at dump, saying why (exit 3).
func TestDumpUserNamespaceRefused(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	unshare := testutil.RequireCommand(t, "unshare", "sleep")
	cmd := exec.Command(unshare, "--user", "--map-root-user", "sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// unshare execs sleep once the namespace is made.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid)); strings.TrimSpace(string(comm)) == "sleep" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("unshare did not exec sleep")
		}
	}
	r := runSnapctl(t, "dump", "-t", strconv.Itoa(cmd.Process.Pid), "-D", filepath.Join(t.TempDir(), "snap"), "--leave-running")
	if r.Code != 3 || !strings.Contains(r.Stderr, "user namespace") {
		t.Errorf("dump of a process in a user namespace: want exit 3 naming it\n%s", r)
	}
}
