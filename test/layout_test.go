package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestLayout holds the import rules docs/architecture.md (Packages)
// states: what each layer may depend on, directly or not (go list's Deps),
// or import itself (its Imports).
func TestLayout(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go not on PATH")
	}
	const mod = "github.com/lazyfs/lazyfs/"
	list := func(field string) (map[string][]string, string) {
		out, err := exec.Command(goBin, "list", "-f", "{{.ImportPath}}{{range ."+field+"}} {{.}}{{end}}", mod+"...").Output()
		if err != nil {
			t.Fatalf("go list: %v", err)
		}
		m := map[string][]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(line)
			var ours []string
			for _, d := range f[1:] {
				if rest, ok := strings.CutPrefix(d, mod); ok {
					ours = append(ours, rest)
				}
			}
			m[strings.TrimPrefix(f[0], mod)] = ours
		}
		return m, string(out)
	}
	deps, out := list("Deps")
	imports, _ := list("Imports")
	// pkg (or every package under it, with a trailing /) must not depend
	// on any of these (again, a trailing / is a whole tree).
	rules := []struct {
		pkg       string
		forbidden []string
		why       string
		direct    bool // imports only: the packages it names in its import blocks
	}{
		{"engine/", []string{"fs", "fs/", "cmd/"}, "the engine knows nothing of mounts or of the commands", false},
		{"engine", []string{"fs", "cmd/", "engine/image/store/s3", "engine/image/store/archive"}, "the engine knows nothing of mounts or of the commands, nor which stores they registered", false},
		{"cmd/", []string{"engine/uffd"}, "commands wire flags to options; the pager is the engine's", true},
		{"cmd/", []string{"engine/uffd/"}, "commands wire flags to options; the userfaultfd calls, the pager's policy and its keeper are the engine's", true},
		{"engine/uffd/uffdio", []string{"engine", "engine/", "fs", "cmd/"}, "the kernel interface is a leaf: it knows nothing of the pager that uses it", false},
		{"engine/uffd/keeper", []string{"engine", "engine/uffd", "engine/lazy", "fs", "cmd/"}, "the keeper only holds descriptors: it knows nothing of the pager", false},
		{"engine/uffd/pending", []string{"engine", "engine/", "fs", "cmd/"}, "the pending set is a plain data structure", false},
		{"engine/uffd/policy", []string{"engine", "engine/uffd", "engine/lazy", "engine/mem", "engine/proc", "engine/helper", "fs", "cmd/"}, "the pager's policy is pure: it sees faults, not processes, descriptors or files", false},
		{"engine/image", []string{"engine", "engine/fds", "engine/mem", "engine/task", "engine/ptrace", "engine/uffd", "engine/uffd/", "engine/check", "engine/image/store/s3", "engine/image/store/archive", "engine/image/workingset", "fs", "cmd/"}, "the format is a leaf: it reads and writes bytes, and knows stores only by their interface", false},
		{"engine/image/", []string{"engine", "engine/fds", "engine/mem", "engine/task", "engine/ptrace", "engine/uffd", "engine/uffd/", "fs", "cmd/"}, "the format is a leaf", false},
		{"engine/image/store", []string{"engine", "engine/image", "fs", "cmd/"}, "the Store interface knows nothing of the format, which reaches stores through it", false},
		{"engine/image/store/cache", []string{"engine/image", "engine/image/store/s3"}, "the cache directory serves any store: it knows neither the format nor the S3 store", false},
		{"engine/image/store/trace", []string{"engine/image", "engine/image/store/s3"}, "the request log serves any store that speaks HTTP", false},
		{"engine/image/store/storetest", []string{"engine/image", "engine/image/store/s3", "engine/image/store/archive"}, "the conformance suite knows stores only by their interface", false},
		{"engine/image/workingset", []string{"engine/lazy", "engine/image/store/s3", "engine/image/store/archive"}, "the working-set file beside the format, which knows nothing of it; which one a restore uses is engine/lazy's", false},
		{"engine/image/seal", []string{"engine", "engine/codec", "engine/image", "engine/image/store/", "engine/fds", "engine/mem", "engine/task", "engine/ptrace", "engine/uffd", "engine/uffd/", "cache", "fs", "fs/", "cmd/"}, "seal is below the format: bytes, keys and windows (and the store's one sentinel for a path not to trust); the format imports it, not the reverse", false},
		{"engine/proc", []string{"engine", "engine/ptrace", "engine/image", "fs", "cmd/"}, "proc only reads /proc", false},
		{"engine/proc/", []string{"engine", "engine/ptrace", "engine/image", "fs", "cmd/"}, "proc's subpackages only read /proc and ask the kernel", false},
		{"engine/codec", []string{"engine", "engine/image", "fs", "cmd/"}, "the codec is a leaf", false},
		{"engine/ptrace/raw", []string{"engine", "engine/", "fs", "cmd/"}, "the ptrace requests are a leaf: the tracer is built on them", false},
		{"engine/ptrace", []string{"engine/ptrace/syscalls"}, "the tracer is the mechanism: the typed calls are built on it, not the reverse", false},
		{"engine/ptrace/syscalls", []string{"engine", "engine/fds", "engine/mem", "engine/task", "engine/uffd", "engine/uffd/", "fs", "cmd/"}, "the typed calls know only the tracer: nothing of the dumps and restores that use them", false},
		{"cache", []string{"engine", "engine/", "fs", "cmd/"}, "the cache is generic", false},
		{"fs", []string{"engine", "engine/fds", "engine/mem", "engine/task", "engine/ptrace", "engine/uffd", "engine/uffd/", "engine/image/store/s3", "engine/image/store/archive", "cmd/"}, "fs serves snapshots through engine/image only", false},
		{"fs/", []string{"engine", "engine/fds", "engine/mem", "engine/task", "engine/ptrace", "engine/uffd", "engine/uffd/", "engine/image/store/s3", "engine/image/store/archive", "cmd/"}, "fs serves snapshots through engine/image only", false},
		{"engine/", []string{"engine/image/store/s3", "engine/image/store/archive"}, "a store is chosen by the commands (cmd/internal/cli registers it); the engine reads through engine/image", false},
		{"engine/lazy", []string{"engine", "engine/task", "engine/ns", "fs", "cmd/"}, "the lazy phase reads memory through image.PageSource: it knows no mount and nothing of the restore around it", false},
		{"engine/ns", []string{"engine", "engine/image", "engine/lazy", "fs", "cmd/"}, "namespaces know nothing of snapshots", false},
		{"engine/mem", []string{"engine/mem/precopy"}, "pre-copy builds on mem: mem.Dump takes its copy through mem.PreCopied", false},
		{"engine/mem/precopy", []string{"engine", "engine/task", "engine/fds", "engine/lazy", "fs", "cmd/"}, "pre-copy only tracks and copies memory: it knows nothing of the dump around it", true},
		{"engine/helper", []string{"engine", "engine/", "fs", "fs/", "cache", "cmd/"}, "the helper processes' protocol is a leaf: the keeper, the private mount and the pid namespace's init use it", false},
		{"engine/fds/", []string{"engine", "engine/fds", "engine/mem", "engine/task", "engine/uffd", "fs", "cmd/"}, "a kind of descriptor with a package of its own is called by engine/fds, never calling it back but through what fds hands it", false},
	}
	match := func(pattern, pkg string) bool {
		if p, ok := strings.CutSuffix(pattern, "/"); ok {
			return strings.HasPrefix(pkg, p+"/")
		}
		return pkg == pattern
	}
	checked := 0
	for pkg, ds := range deps {
		if strings.HasPrefix(pkg, "test") {
			continue
		}
		for _, r := range rules {
			if !match(r.pkg, pkg) {
				continue
			}
			checked++
			if r.direct {
				ds = imports[pkg]
			}
			for _, d := range ds {
				for _, f := range r.forbidden {
					if match(f, d) {
						t.Errorf("%s depends on %s: %s", pkg, d, r.why)
					}
				}
			}
		}
	}
	if checked < 10 {
		t.Errorf("only %d packages checked: go list output changed?\n%s", checked, out)
	}
}

// TestLayoutSeams holds two rules docs/architecture.md (Packages) states
// that imports alone do not show: a lazy restore's page source is built
// where its knowledge lives (engine/image, fs), so the commands call none
// of the readers and mounts a source is made of; and no package the commands may
// import re-exports a type of engine/uffd under its own name (an alias
// would let a command use the pager's types without importing it).
func TestLayoutSeams(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	// What a page source is made of: reading a snapshot's memory
	// uncached, checked or mixed with a mount's, and the mounts' files.
	sourceParts := map[string]bool{"Uncached": true, "Checked": true, "Mixed": true,
		"MountPrivate": true, "MountPrivateTree": true, "OpenMount": true, "OpenMem": true}
	parse := func(dir string, visit func(name string, f *ast.File)) {
		t.Helper()
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			visit(name, f)
		}
	}
	checked := 0
	for _, dir := range []string{"cmd/snapctl", "cmd/lazyfs", "cmd/internal/cli"} {
		parse(dir, func(name string, f *ast.File) {
			checked++
			ast.Inspect(f, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok && sourceParts[sel.Sel.Name] {
					t.Errorf("%s calls %s: a page source is built in engine/image or fs, and the command picks one", filepath.Base(name), sel.Sel.Name)
				}
				return true
			})
		})
	}
	for _, dir := range []string{"engine", "engine/lazy", "engine/ns", "engine/image", "engine/task", "engine/fds", "engine/check", "fs"} {
		parse(dir, func(name string, f *ast.File) {
			checked++
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok != token.TYPE {
					continue
				}
				for _, sp := range g.Specs {
					ts := sp.(*ast.TypeSpec)
					sel, ok := ts.Type.(*ast.SelectorExpr)
					if !ok || !ts.Assign.IsValid() {
						continue
					}
					if id, ok := sel.X.(*ast.Ident); ok && id.Name == "uffd" {
						t.Errorf("%s/%s: type %s = uffd.%s re-exports the pager's type", dir, filepath.Base(name), ts.Name.Name, sel.Sel.Name)
					}
				}
			}
		})
	}
	if checked < 20 {
		t.Errorf("only %d files checked: moved?", checked)
	}
}
