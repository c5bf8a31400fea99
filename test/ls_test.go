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
