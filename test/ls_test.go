package e2e

// snapctl ls and rm: the snapshots of a directory, an incremental one with
// its parent, and the files a dump that did not finish left, which a
// listing must show (they take room, and a new dump refuses the
// directory); directories that hold neither are not listed, nor removed.
// A parent is not removed while an incremental snapshot beside it needs
// it.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

func TestLs(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	p := fixture.Start(t, "counter", "4M")
	root := t.TempDir()
	dumpPID(t, p.PID, filepath.Join(root, "base"), "--leave-running")
	dumpPID(t, p.PID, filepath.Join(root, "next"), "--leave-running", "--parent", filepath.Join(root, "base"))
	for _, d := range []string{"killed", "www"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(root, "killed", "pages-42.img"), make([]byte, 4096), 0o600)
	os.WriteFile(filepath.Join(root, "www", "index.html"), nil, 0o600)

	var rows []struct {
		Name      string `json:"name"`
		Processes int    `json:"processes"`
		Memory    uint64 `json:"memory_bytes"`
		Stored    uint64 `json:"stored_bytes"`
		Parent    string `json:"parent"`
		State     string `json:"state"`
	}
	if err := json.Unmarshal([]byte(mustSnapctl(t, "ls", "--json", root).Stdout), &rows); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for i, r := range rows {
		got[r.Name] = i
	}
	if len(rows) != 3 {
		t.Fatalf("ls lists %+v: want base, next and killed", rows)
	}
	base, next, killed := rows[got["base"]], rows[got["next"]], rows[got["killed"]]
	if base.State != "complete" || base.Processes != 1 || base.Memory < 4<<20 || base.Stored == 0 {
		t.Errorf("base: %+v", base)
	}
	if next.State != "complete" || next.Parent == "" || next.Stored >= base.Stored {
		t.Errorf("next, incremental on base: %+v", next)
	}
	if !strings.HasPrefix(killed.State, "incomplete") || killed.Stored != 4096 {
		t.Errorf("killed: %+v", killed)
	}
	// A table for people: a line each, under a header.
	out := mustSnapctl(t, "ls", root).Stdout
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 4 || !strings.HasPrefix(lines[0], "NAME") {
		t.Errorf("ls table:\n%s", out)
	}

	at := func(d string) string { return filepath.Join(root, d) }
	if r := runSnapctl(t, "rm", at("base")); r.Code != 1 || !strings.Contains(r.Stderr, at("next")) {
		t.Errorf("rm of the parent of an incremental snapshot: want exit 1 naming it\n%s", r)
	}
	if r := runSnapctl(t, "rm", at("www")); r.Code != 1 || !strings.Contains(r.Stderr, "nothing removed") {
		t.Errorf("rm of a directory no dump wrote: want exit 1\n%s", r)
	}
	mustSnapctl(t, "rm", at("killed"))
	mustSnapctl(t, "rm", at("next"), at("base"))
	for _, d := range []string{"base", "next", "killed"} {
		if _, err := os.Stat(at(d)); !os.IsNotExist(err) {
			t.Errorf("%s after rm: %v", d, err)
		}
	}
	if _, err := os.Stat(filepath.Join(at("www"), "index.html")); err != nil {
		t.Errorf("rm touched a directory no dump wrote: %v", err)
	}
}

// TestLsRmObjectStore: ls and rm on a MinIO bucket: a snapshot, an
// incremental one on it, a dead dump's objects and a prefix that is no
// snapshot; rm refuses the parent while its child is there, and removes
// the child, the parent and the leftovers, nothing else.
func TestLsRmObjectStore(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	m, _ := s3Setup(t, true)
	ctx := testContext(t)
	p := fixture.Start(t, "counter", "4M")
	base, next := "s3://snaps/fleet/base", "s3://snaps/fleet/next"
	dumpPID(t, p.PID, base, "--leave-running")
	dumpPID(t, p.PID, next, "--leave-running", "--parent", base)
	put := func(key string) {
		t.Helper()
		if _, err := m.Client().PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("snaps"), Key: aws.String(key), Body: strings.NewReader("left")}); err != nil {
			t.Fatal(err)
		}
	}
	put("fleet/killed/pages-42.img")
	put("fleet/www/index.html")

	var rows []struct {
		Name      string `json:"name"`
		Processes int    `json:"processes"`
		Memory    uint64 `json:"memory_bytes"`
		Stored    uint64 `json:"stored_bytes"`
		Parent    string `json:"parent"`
		State     string `json:"state"`
	}
	if err := json.Unmarshal([]byte(mustSnapctl(t, "ls", "--json", "s3://snaps/fleet").Stdout), &rows); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for i, r := range rows {
		got[r.Name] = i
	}
	if len(rows) != 3 {
		t.Fatalf("ls lists %+v: want base, next and killed", rows)
	}
	b, n, k := rows[got[base]], rows[got[next]], rows[got["s3://snaps/fleet/killed"]]
	if b.State != "complete" || b.Processes != 1 || b.Memory < 4<<20 || b.Stored == 0 {
		t.Errorf("base: %+v", b)
	}
	if n.State != "complete" || n.Parent != base || n.Stored >= b.Stored {
		t.Errorf("next, incremental on base: %+v", n)
	}
	if !strings.HasPrefix(k.State, "incomplete") || k.Stored != 4 {
		t.Errorf("killed: %+v", k)
	}
	// One snapshot named: that one.
	if out := mustSnapctl(t, "ls", base).Stdout; strings.Count(out, "\n") != 2 || !strings.Contains(out, base) {
		t.Errorf("ls %s:\n%s", base, out)
	}

	if r := runSnapctl(t, "rm", base); r.Code != 1 || !strings.Contains(r.Stderr, next) {
		t.Errorf("rm of the parent of an incremental snapshot: want exit 1 naming it\n%s", r)
	}
	if r := runSnapctl(t, "rm", "s3://snaps/fleet/www"); r.Code != 1 || !strings.Contains(r.Stderr, "nothing removed") {
		t.Errorf("rm of a prefix no dump wrote: want exit 1\n%s", r)
	}
	mustSnapctl(t, "rm", "s3://snaps/fleet/killed")
	mustSnapctl(t, "rm", next, base)
	var left []string
	out, err := m.Client().ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("snaps")})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range out.Contents {
		left = append(left, aws.ToString(o.Key))
	}
	if len(left) != 1 || left[0] != "fleet/www/index.html" {
		t.Errorf("objects left: %q, want only fleet/www/index.html", left)
	}
	if r := mustSnapctl(t, "ls", "--json", "s3://snaps/fleet"); strings.TrimSpace(r.Stdout) != "[]" {
		t.Errorf("ls after rm: %s", r.Stdout)
	}
}
