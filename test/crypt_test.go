package e2e

// End-to-end tests of sealed snapshots (dump --encrypt-to): nothing the
// process held is readable in the snapshot's files; the right identity
// restores it, by every path, and mounts it; no identity, another one, or
// any part of the snapshot changed is refused, naming the part.

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"golang.org/x/crypto/ssh"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/seal"
	"github.com/lazyfs/lazyfs/engine/image/store"
	"github.com/lazyfs/lazyfs/engine/image/store/s3"
	"github.com/lazyfs/lazyfs/engine/image/workingset"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// sealKeys makes an age identity file for the test and another one, and
// sets $LAZYFS_IDENTITY to the first for the test (every snapctl and
// lazyfs the test runs, and openImage, use it). It returns the first's
// recipient and the two files.
func sealKeys(t *testing.T) (recipient, keyFile, otherFile string) {
	t.Helper()
	dir := t.TempDir()
	var files [2]string
	for i := range files {
		id, err := age.GenerateX25519Identity()
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			recipient = id.Recipient().String()
		}
		files[i] = filepath.Join(dir, fmt.Sprintf("key%d.txt", i))
		if err := os.WriteFile(files[i], []byte(id.String()+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(seal.IdentityEnv, files[0])
	return recipient, files[0], files[1]
}

// runSnapctlEnv runs snapctl with args with $LAZYFS_IDENTITY set to
// identity ("" unsets it).
func runSnapctlEnv(t *testing.T, identity string, args ...string) cmdResult {
	t.Helper()
	prev := os.Getenv(seal.IdentityEnv)
	if identity == "" {
		os.Unsetenv(seal.IdentityEnv)
	} else {
		os.Setenv(seal.IdentityEnv, identity)
	}
	defer os.Setenv(seal.IdentityEnv, prev)
	return runSnapctl(t, args...)
}

// noSecretIn checks with strings and grep that no file of the snapshot
// holds any of the secrets.
func noSecretIn(t *testing.T, dir string, secrets ...[]byte) {
	t.Helper()
	testutil.RequireCommand(t, "strings", "grep")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		path := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		strs := testutil.Output(t, "strings", "-a", "-n", "6", path)
		for _, s := range secrets {
			if bytes.Contains(b, s) || bytes.Contains(strs, s) {
				t.Errorf("%s holds the secret %q", path, s)
			}
			// grep -F exits 1 when the file does not hold the string.
			if err := exec.Command("grep", "-q", "-a", "-F", string(s), path).Run(); err == nil {
				t.Errorf("grep finds %q in %s", s, path)
			}
		}
	}
}

// TestSealedCounter dumps the counter fixture sealed for an age recipient:
// the image read with the identity equals the memory of the stopped
// process; no file shows its marker or its random bytes; a lazyfs mount
// shows every region as the process held it (cmp); inspect says how it is
// sealed; lazyfs without an identity refuses it.
func TestSealedCounter(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	testutil.RequireCommand(t, "cmp")
	ctx := testContext(t)
	recipient, keyFile, _ := sealKeys(t)
	p := fixture.Start(t, "counter", "16M")
	marker, _ := p.Ready.Value("marker")
	random := p.Ready.MustUint(t, "addr") + p.Ready.MustUint(t, "random_off")

	// Dumped with --leave-running: the image equals the stopped process.
	si, rec := dumpRecorded(t, ctx, p, "--encrypt-to", recipient)
	if !si.Snap.Sealed() || !si.Snap.Manifest.HasFeature(image.FeatureSealed) {
		t.Fatal("the snapshot is not sealed")
	}
	t.Run("no secret in the files", func(t *testing.T) {
		noSecretIn(t, si.Dir, []byte(marker), rec.bytes(random+8192, 32), []byte("counter"))
	})
	t.Run("inspect", func(t *testing.T) {
		r := runSnapctlEnv(t, "", "inspect", "-D", si.Dir)
		if r.Code != 0 || !strings.Contains(r.Stdout, "AES-256-GCM") || !strings.Contains(r.Stdout, recipient) || !strings.Contains(r.Stdout, "not opened") {
			t.Errorf("inspect without an identity:\n%s", r)
		}
		r = mustSnapctl(t, "inspect", "-D", si.Dir)
		if !strings.Contains(r.Stdout, recipient) || !strings.Contains(r.Stdout, "authenticated") || !strings.Contains(r.Stdout, "counter") {
			t.Errorf("inspect with the identity:\n%s", r)
		}
	})
	t.Run("lazyfs mount: cmp of every region", func(t *testing.T) {
		model := newMemModel(t, rec, si)
		mnt := lazyMountLazyfs(t, si.Dir)
		pdir := filepath.Join(mnt, strconv.Itoa(p.PID))
		regs := checkRegions(t, si, pdir, model)
		t.Logf("%d region files, %d dumped bytes, compared with cmp", len(regs), model.dataBytes())
		if b, err := os.ReadFile(filepath.Join(pdir, "process.json")); err != nil || !bytes.Contains(b, []byte(si.State.Comm)) {
			t.Errorf("process.json through the mount does not show comm %q: %v", si.State.Comm, err)
		}
	})
	t.Run("lazyfs without an identity", func(t *testing.T) {
		os.Unsetenv(seal.IdentityEnv)
		defer os.Setenv(seal.IdentityEnv, keyFile)
		mnt := t.TempDir()
		r := runTool(t, buildTool(t, "lazyfs"), commandTimeout, si.Dir, mnt)
		if r.Code != exitUntrusted || !strings.Contains(r.Stderr, recipient) {
			t.Errorf("lazyfs of a sealed snapshot without an identity: exit %d, want %d\n%s", r.Code, exitUntrusted, r)
		}
		if mountedAt(t, mnt) {
			t.Errorf("mounted anyway")
		}
	})
}

// TestSealedCounterRestore dumps the counter fixture sealed for an age
// identity file (one key file that seals and opens): restores with the
// identity answer right, eager and lazy from every source; without it,
// with another, or with any part changed, the restore is refused before
// anything is created, naming the part; a block changed under a lazy
// restore kills the process.
func TestSealedCounterRestore(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	recipient, keyFile, otherFile := sealKeys(t)
	p := fixture.Start(t, "counter", "16M")
	random := p.Ready.MustUint(t, "addr") + p.Ready.MustUint(t, "random_off")
	dir, si := dumpForRestore(t, ctx, p, "--encrypt-to", keyFile)
	atDump := fixtureCounter(t, si, p)
	t.Run("refused without the identity", func(t *testing.T) {
		r := runSnapctlEnv(t, "", "restore", "-D", dir)
		wantRefused(t, ctx, r, exitUntrusted, p.PID, "encrypted for "+recipient, "--identity")
		r = runSnapctlEnv(t, "", "restore", "-D", dir, "--identity", otherFile)
		wantRefused(t, ctx, r, exitUntrusted, p.PID, image.KeysName, otherFile)
		r = runSnapctlEnv(t, "", "verify", "-D", dir)
		if r.Code != exitUntrusted {
			t.Errorf("verify without the identity: %s", r)
		}
	})
	t.Run("tampered", func(t *testing.T) {
		e := si.Snap.Manifest.Processes[0]
		var raws []image.Block
		for b := range si.Pages.Blocks() {
			if b.Kind == codec.Raw && b.Addr >= random {
				raws = append(raws, b)
			}
		}
		if len(raws) < 2 {
			t.Fatal("fewer than two raw blocks")
		}
		a, b := raws[0], raws[1]
		for _, tc := range []struct {
			name   string
			change func(d string)
			names  []string
		}{
			{"a bit of a block", flipAt(e.Pages, int64(a.Off)+100), []string{e.Pages, fmt.Sprintf("block %d at %#x", a.Index, a.Addr), "authentication failed"}},
			{"a bit of the index", flipAt(e.Index, 90), []string{e.Index, "authentication failed"}},
			{"a bit of the state", flipAt(e.State, 200), []string{e.State, "authentication failed"}},
			{"a bit of the manifest", flipAt(image.ManifestName, 30), []string{image.ManifestName, "authentication failed"}},
			{"a block copied over another", func(d string) {
				path := filepath.Join(d, e.Pages)
				buf, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				copy(buf[b.Off:b.Off+uint64(b.StoredLen)], buf[a.Off:a.Off+uint64(a.StoredLen)])
				os.WriteFile(path, buf, 0o600)
			}, []string{e.Pages, fmt.Sprintf("block %d at %#x", b.Index, b.Addr), "authentication failed"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				d := filepath.Join(t.TempDir(), "snap")
				copySnapshot(t, dir, d)
				tc.change(d)
				r := runSnapctl(t, "restore", "-D", d)
				wantRefused(t, ctx, r, exitUntrusted, p.PID, tc.names...)
				t.Logf("%s", strings.TrimSpace(r.Stderr))
				r = runSnapctl(t, "verify", "-D", d)
				if r.Code != exitUntrusted || !strings.Contains(r.Stderr, tc.names[0]) {
					t.Errorf("verify: exit %d, want %d naming %s\n%s", r.Code, exitUntrusted, tc.names[0], r)
				}
			})
		}
		// A block that fails during a lazy restore kills the process.
		for _, source := range []string{"mount", "direct"} {
			t.Run("lazy "+source+" bad block", func(t *testing.T) {
				d := filepath.Join(t.TempDir(), "snap")
				copySnapshot(t, dir, d)
				flipAt(e.Pages, int64(b.Off)+7)(d)
				l := startLazy(t, d, "--source", source)
				l.waitRunning(t, ctx)
				r := l.wait(t, ctx)
				if r.Code != exitUntrusted || !strings.Contains(r.Stderr, fmt.Sprintf("block %d at %#x", b.Index, b.Addr)) {
					t.Fatalf("lazy restore of a changed block: exit %d, want %d naming the block\n%s", r.Code, exitUntrusted, r)
				}
				if !pidGone(ctx, p.PID) {
					t.Errorf("pid %d still there after the failed lazy restore", p.PID)
				}
				l.lazyNothingLeft(t, d)
			})
		}
	})
	t.Run("no working set recorded", func(t *testing.T) {
		// It would hold in clear the addresses the process touched and
		// their memory: refused before anything is created.
		r := runSnapctl(t, "restore", "-D", dir, "--lazy", "--record-working-set")
		wantRefused(t, ctx, r, exitUnsupported, p.PID, "is sealed", "working set")
		if _, err := os.Stat(filepath.Join(dir, workingset.Name(p.PID))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a working set beside the sealed snapshot: %v", err)
		}
	})
	t.Run("restored with the identity", func(t *testing.T) {
		mnt := lazyMountLazyfs(t, dir)
		for _, tc := range []struct {
			name  string
			flags []string
		}{
			{"eager", nil},
			{"lazy private mount", []string{"--lazy"}},
			{"lazy direct", []string{"--lazy", "--source", "direct"}},
			{"lazy lazyfs mount", []string{"--lazy", "--mount", mnt}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if len(tc.flags) > 0 {
					lazyRestoreCounter(t, ctx, p, dir, atDump, tc.flags[1:]...)
					return
				}
				restoreAndAdopt(t, p, dir, "--identity", keyFile)
				lazyCheckCounter(t, ctx, p, atDump)
				lazyKill(t, ctx, p)
			})
		}
	})
}

// fixtureCounter returns the counter of the counter fixture in the image.
func fixtureCounter(t *testing.T, si *snapImage, p *fixture.Proc) uint64 {
	t.Helper()
	b := si.read(t, p.Ready.MustUint(t, "counter_addr"), 8)
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

// flipAt returns a change that flips a bit of file name at off (from the
// end if negative) in a snapshot directory.
func flipAt(name string, off int64) func(string) {
	return func(d string) {
		path := filepath.Join(d, name)
		b, err := os.ReadFile(path)
		if err != nil {
			panic(err)
		}
		if off < 0 {
			off += int64(len(b))
		}
		b[off] ^= 0x04
		if err := os.WriteFile(path, b, 0o600); err != nil {
			panic(err)
		}
	}
}

// TestSealedRedis dumps redis-server holding a secret value sealed: no
// file of the snapshot shows it; restored with the identity, redis
// answers it; without, the restore is refused.
func TestSealedRedis(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	recipient, keyFile, _ := sealKeys(t)
	p := fixture.StartRedis(t)
	secret := fmt.Sprintf("lazyfs-secret-%d-%x", p.PID, time.Now().UnixNano())
	if r, err := fixture.Redis(ctx, p.Port, "SET", "password", secret); err != nil || r != "OK" {
		t.Fatalf("SET: %q %v", r, err)
	}
	if err := redisLoad(ctx, p.Port, 20000); err != nil {
		t.Fatal(err)
	}
	dir, _ := dumpForRestore(t, ctx, p, "--encrypt-to", recipient)
	noSecretIn(t, dir, []byte(secret), []byte("password"), []byte("redis-server"))

	r := runSnapctlEnv(t, "", "restore", "-D", dir)
	wantRefused(t, ctx, r, exitUntrusted, p.PID, recipient)

	for _, lazy := range []bool{false, true} {
		t.Run(fmt.Sprintf("lazy=%v", lazy), func(t *testing.T) {
			if lazy {
				l := startLazy(t, dir, "--identity", keyFile)
				l.waitRunning(t, ctx)
				if err := p.Adopt(); err != nil {
					t.Fatal(err)
				}
				defer l.mustFinish(t, ctx, p.PID)
			} else {
				restoreAndAdopt(t, p, dir, "--identity", keyFile)
			}
			if got, err := fixture.Redis(ctx, p.Port, "GET", "password"); err != nil || got != secret {
				t.Errorf("GET password after the restore: %q %v, want %q", got, err, secret)
			}
			if err := redisSample(ctx, p.Port, 20000, 97); err != nil {
				t.Errorf("after the restore: %v", err)
			}
		})
		if err := p.Kill(ctx); err != nil {
			t.Fatal(err)
		}
		if !pidGone(ctx, p.PID) {
			t.Fatalf("pid %d still taken", p.PID)
		}
	}
}

// signKeys writes an OpenSSH ed25519 key pair, as ssh-keygen -t ed25519
// would, and sets $LAZYFS_IDENTITY to the public key for the test.
func signKeys(t *testing.T) (key, pub string) {
	t.Helper()
	pk, sk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	blk, err := ssh.MarshalPrivateKey(sk, "lazyfs test")
	if err != nil {
		t.Fatal(err)
	}
	sp, err := ssh.NewPublicKey(pk)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	key, pub = filepath.Join(dir, "sign"), filepath.Join(dir, "sign.pub")
	if err := os.WriteFile(key, pem.EncodeToMemory(blk), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pub, ssh.MarshalAuthorizedKey(sp), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(seal.IdentityEnv, pub)
	return key, pub
}

// TestSignedCounter dumps the counter fixture signed (--sign): restored
// with the signer's public key it answers right; without a key, or with
// any part changed, the restore is refused naming the part.
func TestSignedCounter(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	ctx := testContext(t)
	key, pub := signKeys(t)
	p := fixture.Start(t, "counter", "16M")
	dir, si := dumpForRestore(t, ctx, p, "--sign", key)
	if !si.Snap.Signed() || si.Snap.Sealed() {
		t.Fatalf("signed %v, sealed %v", si.Snap.Signed(), si.Snap.Sealed())
	}
	atDump := fixtureCounter(t, si, p)
	r := runSnapctlEnv(t, "", "inspect", "-D", dir)
	if r.Code != 0 || !strings.Contains(r.Stdout, "signed: ed25519") || !strings.Contains(r.Stdout, "not verified") {
		t.Errorf("inspect without a key:\n%s", r)
	}
	r = runSnapctlEnv(t, "", "restore", "-D", dir)
	wantRefused(t, ctx, r, exitUntrusted, p.PID, "signed by ssh-ed25519", "--identity")

	e := si.Snap.Manifest.Processes[0]
	var blk image.Block
	for b := range si.Pages.Blocks() {
		if b.Kind == codec.Raw {
			blk = b
		}
	}
	for _, tc := range []struct {
		name   string
		change func(string)
		names  []string
	}{
		{"a bit of a block", flipAt(e.Pages, int64(blk.Off)+33), []string{e.Pages, fmt.Sprintf("block %d at %#x", blk.Index, blk.Addr), "authentication failed"}},
		{"a bit of the digests", flipAt(e.Digests, 3), []string{e.Digests, "authentication failed"}},
		{"a bit of the index", flipAt(e.Index, 70), []string{e.Index, "authentication failed"}},
		{"a bit of the state", flipAt(e.State, 70), []string{e.State, "authentication failed"}},
		{"a bit of the manifest", flipAt(image.ManifestName, 40), []string{image.ManifestName, "authentication failed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := filepath.Join(t.TempDir(), "snap")
			copySnapshot(t, dir, d)
			tc.change(d)
			r := runSnapctl(t, "restore", "-D", d)
			wantRefused(t, ctx, r, exitUntrusted, p.PID, tc.names...)
		})
	}
	for _, flags := range [][]string{{"--identity", pub}, {"--lazy", "--source", "direct"}} {
		t.Run(strings.Join(flags, " "), func(t *testing.T) {
			if flags[0] == "--lazy" {
				l := startLazy(t, dir, flags[1:]...)
				l.waitRunning(t, ctx)
				if err := p.Adopt(); err != nil {
					t.Fatal(err)
				}
				l.mustFinish(t, ctx, p.PID)
			} else {
				restoreAndAdopt(t, p, dir, flags...)
			}
			lazyCheckCounter(t, ctx, p, atDump)
			lazyKill(t, ctx, p)
		})
	}
	t.Run("working set: addresses only", func(t *testing.T) {
		d := filepath.Join(t.TempDir(), "snap")
		copySnapshot(t, dir, d)
		lazy := func() {
			t.Helper()
			l := startLazy(t, d, "--source", "direct", "--record-working-set", "--record-for", "300ms")
			l.waitRunning(t, ctx)
			if err := p.Adopt(); err != nil {
				t.Fatal(err)
			}
			l.mustFinish(t, ctx, p.PID)
			lazyCheckCounter(t, ctx, p, atDump)
			lazyKill(t, ctx, p)
		}
		lazy()
		ws, err := workingset.ReadDir(d, p.PID, si.Snap.ID(), false)
		if err != nil {
			t.Fatal(err)
		}
		if len(ws.Entries) == 0 || ws.HasData() {
			t.Errorf("working set of a signed snapshot: %d entries, with their memory %v; want addresses only", len(ws.Entries), ws.HasData())
		}
		// A working set whose copy of the memory is forged (its own
		// CRC32C right) over pages the fixture checksums: a restore of
		// the signed snapshot uses its addresses, never that copy.
		ra := (p.Ready.MustUint(t, "addr") + p.Ready.MustUint(t, "random_off") + image.PageSize - 1) &^ (image.PageSize - 1)
		forged := &workingset.Set{PID: p.PID, Snapshot: si.Snap.ID(), Stop: "signal",
			Entries: []workingset.Entry{{Addr: ra, Len: 4 * image.PageSize, Data: make([]byte, 4*image.PageSize)}}}
		if err := workingset.WriteDir(d, forged); err != nil {
			t.Fatal(err)
		}
		l := startLazy(t, d, "--source", "direct", "-v")
		l.waitRunning(t, ctx)
		if err := p.Adopt(); err != nil {
			t.Fatal(err)
		}
		r := l.mustFinish(t, ctx, p.PID)
		lazyCheckCounter(t, ctx, p, atDump)
		lazyKill(t, ctx, p)
		if !strings.Contains(r.Stderr, "copy=false") {
			t.Errorf("the restore did not say it used the working set's addresses only (copy=false):\n%s", r.Stderr)
		}
	})
}

// TestSealedS3 dumps the counter fixture sealed into an object store
// (MinIO): its keys.age and snapshot.auth are objects beside the others;
// verify, an eager restore and lazy restores through the private mount
// (whose helper reads the store and the identity files) and direct work
// with the identity, and are refused without it or with another one,
// naming what is missing.
func TestSealedS3(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	s3Setup(t, true)
	ctx := testContext(t)
	recipient, keyFile, otherFile := sealKeys(t)
	p := fixture.Start(t, "counter", "16M")
	addr := "s3://snaps/sealed/counter"
	r := dumpPID(t, p.PID, addr, "--encrypt-to", keyFile)
	t.Logf("%s", strings.TrimSpace(r.Stdout))
	if _, err := p.WaitExit(ctx); err != nil {
		t.Fatalf("the process outlived its dump: %v", err)
	}
	si := openImage(t, addr, p.PID)
	if !si.Snap.Sealed() {
		t.Fatalf("%s opened as not sealed", addr)
	}
	if _, ok := si.Snap.Manifest.Files[image.KeysName]; !ok {
		t.Errorf("the manifest lists no %s", image.KeysName)
	}
	st, err := s3.Open(addr, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{image.KeysName, image.AuthName} {
		if _, err := st.Stat(name); err != nil {
			t.Errorf("no object %s/%s: %v", addr, name, err)
		}
	}
	atDump := fixtureCounter(t, si, p)

	t.Run("refused without the identity", func(t *testing.T) {
		r := runSnapctlEnv(t, "", "restore", "-D", addr)
		wantRefused(t, ctx, r, exitUntrusted, p.PID, "encrypted for "+recipient, "--identity")
		r = runSnapctlEnv(t, "", "restore", "-D", addr, "--lazy", "--identity", otherFile)
		wantRefused(t, ctx, r, exitUntrusted, p.PID, addr+"/"+image.KeysName, otherFile)
	})
	t.Run("verify", func(t *testing.T) {
		r := mustSnapctl(t, "verify", "-D", addr)
		if !strings.Contains(r.Stdout, "sealed and authenticated") {
			t.Errorf("verify does not say the snapshot is sealed and authenticated:\n%s", r.Stdout)
		}
	})
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"eager", nil},
		{"lazy private mount", []string{"--lazy"}},
		{"lazy direct", []string{"--lazy", "--source", "direct"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.flags) > 0 {
				lazyRestoreCounter(t, ctx, p, addr, atDump, tc.flags[1:]...)
				return
			}
			restoreAndAdopt(t, p, addr)
			lazyCheckCounter(t, ctx, p, atDump)
			lazyKill(t, ctx, p)
		})
	}
	t.Run("cached chunks with right trailers and wrong bytes: fetched again", func(t *testing.T) {
		cache := filepath.Join(t.TempDir(), "cache")
		restoreAndAdopt(t, p, addr, "--cache-dir", cache)
		lazyKill(t, ctx, p)
		n := damageChunks(t, cache)
		for _, lazy := range []bool{false, true} {
			if lazy {
				n = damageChunks(t, cache)
				lazyRestoreCounter(t, ctx, p, addr, atDump, "--cache-dir", cache, "--source", "direct")
				continue
			}
			r := restoreAndAdopt(t, p, addr, "--cache-dir", cache)
			lazyCheckCounter(t, ctx, p, atDump)
			if !strings.Contains(r.Stderr, "fetched again") {
				t.Errorf("%d sealed chunks damaged: the restore does not say it fetched any again\n%s", n, r)
			}
			lazyKill(t, ctx, p)
		}
	})
}
