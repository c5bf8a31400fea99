package lockcheck

import (
	"go/importer"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestGuarded checks the test input: each want comment is reported on its
// line, and nothing else is.
func TestGuarded(t *testing.T) {
	dir := filepath.Join("testdata", "guarded")
	res, err := Check(Package{ImportPath: "guarded", Dir: dir, GoFiles: []string{"guarded.go"}}, importer.Default())
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(dir, "guarded.go"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]*regexp.Regexp{}
	wantRE := regexp.MustCompile(`// want "(.*)"$`)
	for i, line := range strings.Split(string(src), "\n") {
		if m := wantRE.FindStringSubmatch(line); m != nil {
			want[i+1] = regexp.MustCompile(strings.ReplaceAll(m[1], `\\`, `\`))
		}
	}
	got := map[int]bool{}
	for _, d := range res.Diagnostics {
		re, ok := want[d.Pos.Line]
		switch {
		case !ok:
			t.Errorf("unexpected: %s", d)
		case !re.MatchString(d.Message):
			t.Errorf("line %d: %q does not match %q", d.Pos.Line, d.Message, re)
		}
		got[d.Pos.Line] = true
	}
	for line, re := range want {
		if !got[line] {
			t.Errorf("line %d: nothing reported, want %q", line, re)
		}
	}
	if res.Guarded != 3 {
		t.Errorf("guarded fields: %d, want 3", res.Guarded)
	}
}
