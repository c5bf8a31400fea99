package e2e

// The manual (docs/) against the code it describes: the package table of
// docs/architecture.md against the packages go list reports, and the CLI
// reference, docs/cli.md, against the options each command's --help lists.

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/test/testutil"
)

// readDoc returns the text of a file of the repository (a path relative
// to its root, such as docs/cli.md).
func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), filepath.FromSlash(name)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// docHeading is a Markdown heading: its level (the number of #) and text.
var docHeading = regexp.MustCompile(`^(#{1,6}) (.*)$`)

// docSection returns the section of the Markdown doc whose heading text
// matches re: its heading line and every line after it up to the next
// heading of the same level or above, code blocks skipped for headings.
// It fails the test unless exactly one heading matches.
func docSection(t *testing.T, name, doc string, re *regexp.Regexp) string {
	t.Helper()
	var out []string
	found, level, code := 0, 0, false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			code = !code
		}
		if m := docHeading.FindStringSubmatch(line); m != nil && !code {
			switch {
			case re.MatchString(m[2]):
				found++
				level = len(m[1])
			case level > 0 && len(m[1]) <= level:
				level = 0
			}
		}
		if level > 0 {
			out = append(out, line)
		}
	}
	if found != 1 {
		t.Errorf("%s: %d headings match %s, want 1", name, found, re)
	}
	return strings.Join(out, "\n")
}

// goCommand is the go command: on PATH, or where Go is installed.
func goCommand(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if p := "/usr/local/go/bin/go"; fileExists(p) {
		return p
	}
	return testutil.RequireCommand(t, "go")
}

func fileExists(name string) bool {
	_, err := os.Stat(name)
	return err == nil
}

// TestDocsPackages: the package table of docs/architecture.md names every
// package of the module but those under test/, each in one row, and
// nothing else. A row may name several packages (`cmd/snapctl`,
// `cmd/lazyfs`); a name ending in /... stands for the packages under it,
// and may only stand for packages under test/.
func TestDocsPackages(t *testing.T) {
	goBin := goCommand(t)
	if goBin == "" {
		return
	}
	root := repoRoot(t)
	run := func(args ...string) string {
		cmd := exec.Command(goBin, args...)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s: %v", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out))
	}
	mod := run("list", "-m")
	// Every package with non-test Go files, by its path in the module.
	all := map[string]bool{}
	for _, p := range strings.Fields(run("list", "-f", "{{if or .GoFiles .CgoFiles}}{{.ImportPath}}{{end}}", "./...")) {
		rel := strings.TrimPrefix(strings.TrimPrefix(p, mod), "/")
		if rel == "" {
			rel = "."
		}
		all[rel] = true
	}
	underTest := func(p string) bool { return p == "test" || strings.HasPrefix(p, "test/") }
	want := map[string]bool{}
	for p := range all {
		if !underTest(p) {
			want[p] = true
		}
	}
	if len(want) < 20 {
		t.Fatalf("go list found only %d packages outside test/: %v", len(want), want)
	}

	const doc = "docs/architecture.md"
	text := readDoc(t, doc)
	var rows []string
	lines := strings.Split(text, "\n")
	for i, line := range lines {
		if strings.HasPrefix(line, "| package |") {
			for _, row := range lines[i+1:] {
				if !strings.HasPrefix(row, "|") {
					break
				}
				if !strings.HasPrefix(row, "|---") && !strings.HasPrefix(row, "| ---") {
					rows = append(rows, row)
				}
			}
			break
		}
	}
	if len(rows) == 0 {
		t.Fatalf("%s has no package table (a table whose header starts with \"| package |\")", doc)
	}
	name := regexp.MustCompile("`([^`]+)`")
	listed := map[string]string{} // package -> the row that names it
	for _, row := range rows {
		first := strings.SplitN(strings.TrimPrefix(row, "|"), "|", 2)[0]
		names := name.FindAllStringSubmatch(first, -1)
		if len(names) == 0 {
			t.Errorf("%s: a row names no package: %s", doc, row)
			continue
		}
		for _, n := range names {
			p := n[1]
			if prefix, ok := strings.CutSuffix(p, "/..."); ok {
				matched := 0
				for q := range all {
					if q == prefix || strings.HasPrefix(q, prefix+"/") {
						matched++
						if !underTest(q) {
							t.Errorf("%s: %s stands for %s, which must have a row of its own", doc, p, q)
						}
					}
				}
				if matched == 0 {
					t.Errorf("%s: %s names no package", doc, p)
				}
				continue
			}
			if !want[p] {
				t.Errorf("%s: %s is not a package of the module (go list ./...) outside test/", doc, p)
				continue
			}
			if prev, dup := listed[p]; dup {
				t.Errorf("%s: %s named in two rows:\n%s\n%s", doc, p, prev, row)
			}
			listed[p] = row
		}
	}
	var missing []string
	for p := range want {
		if _, ok := listed[p]; !ok {
			missing = append(missing, p)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("%s: packages missing from the package table: %s", doc, strings.Join(missing, ", "))
	}
}

// helpOptions returns the option names of a --help: every name on each
// line of its Options section that starts with a dash, aliases included
// ("  -D DIR, --images-dir" gives -D and --images-dir).
func helpOptions(t *testing.T, what, help string) []string {
	t.Helper()
	optLine := regexp.MustCompile(`^  -{1,2}[A-Za-z0-9][A-Za-z0-9-]*`)
	optName := regexp.MustCompile(`^-{1,2}[A-Za-z0-9][A-Za-z0-9-]*`)
	var names []string
	in := false
	for _, line := range strings.Split(help, "\n") {
		switch {
		case line == "Options:":
			in = true
			continue
		case line != "" && !strings.HasPrefix(line, " "):
			in = false // the next section: Description:, Exit status:...
		}
		if !in || !optLine.MatchString(line) {
			continue
		}
		for _, part := range strings.Split(strings.TrimSpace(line), ", ") {
			if n := optName.FindString(part); n != "" {
				names = append(names, n)
			}
		}
	}
	if len(names) == 0 {
		t.Errorf("%s: no options found in its help:\n%s", what, help)
	}
	return names
}

// helpCommands returns the commands the Commands section of snapctl's
// --help lists.
func helpCommands(help string) []string {
	cmdLine := regexp.MustCompile(`^  ([a-z][a-z0-9-]*)\s`)
	var cmds []string
	in := false
	for _, line := range strings.Split(help, "\n") {
		switch {
		case line == "Commands:":
			in = true
		case !strings.HasPrefix(line, " "):
			in = false
		case in:
			if m := cmdLine.FindStringSubmatch(line); m != nil {
				cmds = append(cmds, m[1])
			}
		}
	}
	return cmds
}

// mentions reports whether text names the option name as a whole word
// (-n is not found in --no-compress, nor --cache-dir in --cache-dir-size).
func mentions(text, name string) bool {
	return regexp.MustCompile(`(^|[^A-Za-z0-9-])` + regexp.QuoteMeta(name) + `($|[^A-Za-z0-9-])`).MatchString(text)
}

// TestDocsOptions: docs/cli.md documents, in the section of each command
// (from its heading, "## snapctl dump ...", to the next heading of its
// level), every option that command's --help lists: snapctl's own,
// those of each command of snapctl --help, and lazyfs's.
func TestDocsOptions(t *testing.T) {
	snapctl := buildTool(t, "snapctl")
	lazyfs := buildTool(t, "lazyfs")
	help := func(bin string, args ...string) string {
		t.Helper()
		r := runTool(t, bin, commandTimeout, args...)
		if r.Code != 0 {
			t.Fatalf("%s", r)
		}
		return r.Stdout + r.Stderr
	}
	const doc = "docs/cli.md"
	text := readDoc(t, doc)
	check := func(what, heading, out string) {
		t.Helper()
		section := docSection(t, doc, text, regexp.MustCompile(heading))
		if section == "" {
			return
		}
		var undocumented []string
		for _, n := range helpOptions(t, what, out) {
			if !mentions(section, n) {
				undocumented = append(undocumented, n)
			}
		}
		if len(undocumented) > 0 {
			t.Errorf("%s: the section of %s does not name %s, which %s --help lists", doc, what, strings.Join(undocumented, ", "), what)
		}
	}
	mainHelp := help(snapctl, "--help")
	check("snapctl", `^snapctl COMMAND( |$)`, mainHelp)
	cmds := helpCommands(mainHelp)
	if len(cmds) < 5 {
		t.Fatalf("snapctl --help lists only the commands %v:\n%s", cmds, mainHelp)
	}
	known := map[string]bool{"COMMAND": true}
	for _, c := range cmds {
		known[c] = true
		check("snapctl "+c, `^snapctl `+regexp.QuoteMeta(c)+`( |$)`, help(snapctl, c, "--help"))
	}
	check("lazyfs", `^lazyfs( |$)`, help(lazyfs, "--help"))
	// And no section for a command snapctl does not have.
	for _, line := range strings.Split(text, "\n") {
		if m := regexp.MustCompile(`^#{1,6} snapctl ([A-Za-z][A-Za-z0-9-]*)`).FindStringSubmatch(line); m != nil && !known[m[1]] {
			t.Errorf("%s: %q documents a command that snapctl --help does not list (%v)", doc, line, cmds)
		}
	}
	t.Logf("checked the options of snapctl, lazyfs and snapctl's commands %v", cmds)
}
