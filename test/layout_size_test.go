package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// maxPackageLines bounds the non-test lines of a package, and
// maxFuncLines a function's, as docs/architecture.md (Size) states. The
// snapshot format, engine/image, is the one package allowed past the
// bound: its byte layout is one thing to read.
const (
	maxPackageLines = 2500
	maxFuncLines    = 80
)

// TestLayoutSizes holds the size rules of docs/architecture.md: no package
// but the format's over maxPackageLines non-test lines, and no function
// over maxFuncLines lines unless its doc comment has a paragraph starting
// "Long:" that says why.
func TestLayoutSizes(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("go not on PATH")
	}
	out, err := exec.Command(goBin, "list", "-f", "{{.ImportPath}} {{.Dir}}", "github.com/lazyfs/lazyfs/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/lazyfs/lazyfs/"
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, dir, _ := strings.Cut(line, " ")
		pkg := strings.TrimPrefix(strings.TrimPrefix(path, mod), "github.com/lazyfs/lazyfs")
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		lines := 0
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			src, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			lines += strings.Count(string(src), "\n")
			checked += checkFuncLengths(t, pkg, name, src)
		}
		if lines > maxPackageLines && pkg != "engine/image" {
			t.Errorf("%s has %d non-test lines, over %d: split it by what its parts do (docs/architecture.md)", pkg, lines, maxPackageLines)
		}
	}
	if checked < 500 {
		t.Errorf("only %d functions checked: go list output changed?", checked)
	}
}

// checkFuncLengths reports the functions of one file over maxFuncLines
// lines without a "Long:" paragraph in their doc comment, and returns how
// many functions it looked at.
func checkFuncLengths(t *testing.T, pkg, name string, src []byte) int {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		n++
		length := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
		if length <= maxFuncLines || explainsLength(fd.Doc) {
			continue
		}
		t.Errorf("%s/%s: %s is %d lines, over %d: split it into named steps, or say why not in a \"Long:\" paragraph of its doc comment",
			pkg, filepath.Base(name), fd.Name.Name, length, maxFuncLines)
	}
	return n
}

func explainsLength(doc *ast.CommentGroup) bool {
	if doc == nil {
		return false
	}
	for _, para := range strings.Split(doc.Text(), "\n\n") {
		if rest, ok := strings.CutPrefix(para, "Long:"); ok && len(strings.TrimSpace(rest)) > 10 {
			return true
		}
	}
	return false
}
