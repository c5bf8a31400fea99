// Package lockcheck checks the lock annotations of Go packages: a field
// that a mutex guards is touched only where that mutex is held.
//
// The annotations are gVisor's checklocks comments, in the subset this
// module uses:
//
//   - `// +checklocks:mu` in the comment of a struct field: the field is
//     guarded by mu, a field of type sync.Mutex or sync.RWMutex in the same
//     struct. An access x.f needs x.mu held.
//   - `// +checklocks:s.mu` in a function's doc comment: the caller holds
//     s.mu, where s is the receiver or a parameter and mu a path of fields
//     from it. A call needs the lock held at the call site, with the
//     receiver or argument in place of s.
//   - `// +checklocksignore` in a function's doc comment: the function is
//     not checked (a constructor that touches fields before any other
//     goroutine can see them, say). The comment should say why.
//
// A lock is held from a call of its Lock or RLock method to a call of its
// Unlock or RUnlock method in the same function (a deferred unlock keeps
// it held to the end). The walk follows the statements in order: a branch
// that ends in return, panic, break, continue or goto does not reach what
// follows it; the locks held after an if, a switch or a select are those
// held at the end of every branch that falls through; a loop's body starts
// with the locks held before it and is assumed to leave them as it found
// them. A function literal run by a go statement starts with no lock; any
// other starts with the locks held where it is written (a callback run
// under the lock, as sort.Slice's is). Locks are told apart by the text of
// their expression (s.mu is not t.mu even if s == t), and a read lock
// counts as the lock: the checker does not tell reads from writes.
//
// What it does not see: a guarded field reached through a pointer taken
// to it (p := &s.f), or a lock taken and released in helper functions.
// Such code must carry an annotation or an ignore.
package lockcheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// A Diagnostic is one finding: an access without its lock, a call without
// the lock its callee needs, or an annotation that names no mutex.
type Diagnostic struct {
	Pos     token.Position
	Message string
}

func (d Diagnostic) String() string {
	return fmt.Sprintf("%s:%d: %s", filepath.Base(d.Pos.Filename), d.Pos.Line, d.Message)
}

// Result is what Check found in one package.
type Result struct {
	// Diagnostics, in file and line order.
	Diagnostics []Diagnostic
	// Guarded is the number of annotated fields; Functions the number of
	// annotated functions (requirements and ignores).
	Guarded, Functions int
}

// Package is a package to check: its import path, directory and the Go
// files of its build (without tests).
type Package struct {
	ImportPath string
	Dir        string
	GoFiles    []string
}

// Load lists the packages that patterns name (as go list does, run in dir)
// and returns those whose files carry a +checklocks annotation, with an
// importer that reads the export data of everything they import.
func Load(dir string, patterns ...string) ([]Package, types.Importer, error) {
	args := append([]string{"list", "-deps", "-export", "-json=ImportPath,Dir,GoFiles,Export,DepOnly,Error"}, patterns...)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, nil, fmt.Errorf("go list: %v: %s", err, stderr.Bytes())
	}
	exports := map[string]string{}
	var pkgs []Package
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath, Dir, Export string
			GoFiles                 []string
			DepOnly                 bool
			Error                   *struct{ Err string }
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, nil, fmt.Errorf("go list output: %v", err)
		}
		if p.Error != nil {
			return nil, nil, fmt.Errorf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		exports[p.ImportPath] = p.Export
		if p.DepOnly {
			continue
		}
		annotated, err := hasAnnotations(p.Dir, p.GoFiles)
		if err != nil {
			return nil, nil, err
		}
		if annotated {
			pkgs = append(pkgs, Package{ImportPath: p.ImportPath, Dir: p.Dir, GoFiles: p.GoFiles})
		}
	}
	return pkgs, exportImporter(exports), nil
}

// exportImporter imports packages from the export data files go list
// -export names.
func exportImporter(exports map[string]string) types.Importer {
	return importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
}

func hasAnnotations(dir string, files []string) (bool, error) {
	for _, name := range files {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return false, err
		}
		if bytes.Contains(b, []byte("+checklocks")) {
			return true, nil
		}
	}
	return false, nil
}

// Check type-checks the package and checks its annotations.
func Check(p Package, imp types.Importer) (Result, error) {
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range p.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.ParseComments)
		if err != nil {
			return Result{}, err
		}
		files = append(files, f)
	}
	info := &types.Info{
		Types:      map[ast.Expr]types.TypeAndValue{},
		Defs:       map[*ast.Ident]types.Object{},
		Uses:       map[*ast.Ident]types.Object{},
		Selections: map[*ast.SelectorExpr]*types.Selection{},
	}
	conf := types.Config{Importer: imp}
	if _, err := conf.Check(p.ImportPath, fset, files, info); err != nil {
		return Result{}, fmt.Errorf("type-checking %s: %v", p.ImportPath, err)
	}
	c := &checker{fset: fset, info: info, guards: map[*types.Var]string{}, requires: map[*types.Func][]requirement{}}
	for _, f := range files {
		c.collectFields(f)
	}
	for _, f := range files {
		c.collectFuncs(f)
	}
	for _, f := range files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil && !c.ignored[fd] {
				c.checkFunc(fd)
			}
		}
	}
	sort.Slice(c.diags, func(i, j int) bool {
		a, b := c.diags[i].Pos, c.diags[j].Pos
		if a.Filename != b.Filename {
			return a.Filename < b.Filename
		}
		return a.Line < b.Line
	})
	return Result{Diagnostics: c.diags, Guarded: len(c.guards), Functions: c.annotatedFuncs}, nil
}

// A requirement is one lock a function's caller must hold: the receiver or
// parameter it starts from (its index in the call's operands: -1 for the
// receiver) and the path of fields after it.
type requirement struct {
	operand int
	root    string // the receiver's or parameter's name, for messages
	path    string // ".mu", ".pending.mu"
}

type checker struct {
	fset           *token.FileSet
	info           *types.Info
	guards         map[*types.Var]string // field -> the sibling mutex's name
	requires       map[*types.Func][]requirement
	ignored        map[*ast.FuncDecl]bool
	annotatedFuncs int
	diags          []Diagnostic
}

func (c *checker) report(pos token.Pos, format string, args ...any) {
	c.diags = append(c.diags, Diagnostic{Pos: c.fset.Position(pos), Message: fmt.Sprintf(format, args...)})
}

// annotations returns the +checklocks values in a comment group.
func annotations(groups ...*ast.CommentGroup) (locks []string, ignore bool) {
	for _, g := range groups {
		if g == nil {
			continue
		}
		for _, c := range g.List {
			text := strings.TrimSpace(strings.TrimPrefix(c.Text, "//"))
			if strings.HasPrefix(text, "+checklocksignore") {
				ignore = true
			} else if v, ok := strings.CutPrefix(text, "+checklocks:"); ok {
				locks = append(locks, strings.TrimSpace(v))
			}
		}
	}
	return locks, ignore
}

// collectFields records the guarded fields of every struct type in f.
func (c *checker) collectFields(f *ast.File) {
	ast.Inspect(f, func(n ast.Node) bool {
		st, ok := n.(*ast.StructType)
		if !ok {
			return true
		}
		mutexes := map[string]bool{}
		for _, fl := range st.Fields.List {
			if isMutex(c.info.TypeOf(fl.Type)) {
				for _, name := range fl.Names {
					mutexes[name.Name] = true
				}
			}
		}
		for _, fl := range st.Fields.List {
			locks, _ := annotations(fl.Doc, fl.Comment)
			for _, l := range locks {
				if !mutexes[l] {
					c.report(fl.Pos(), "+checklocks:%s names no sync.Mutex or sync.RWMutex field of this struct", l)
					continue
				}
				for _, name := range fl.Names {
					c.guards[c.info.Defs[name].(*types.Var)] = l
				}
			}
		}
		return true
	})
}

func isMutex(t types.Type) bool {
	named, ok := t.(*types.Named)
	if !ok || named.Obj().Pkg() == nil || named.Obj().Pkg().Path() != "sync" {
		return false
	}
	return named.Obj().Name() == "Mutex" || named.Obj().Name() == "RWMutex"
}

// collectFuncs records what each annotated function's caller must hold.
func (c *checker) collectFuncs(f *ast.File) {
	if c.ignored == nil {
		c.ignored = map[*ast.FuncDecl]bool{}
	}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok {
			continue
		}
		locks, ignore := annotations(fd.Doc)
		if ignore {
			c.ignored[fd] = true
			c.annotatedFuncs++
		}
		if len(locks) == 0 {
			continue
		}
		c.annotatedFuncs++
		fn := c.info.Defs[fd.Name].(*types.Func)
		for _, l := range locks {
			r, ok := c.requirement(fd, l)
			if !ok {
				c.report(fd.Pos(), "+checklocks:%s: %s has no receiver or parameter %q with a mutex at that path", l, fd.Name.Name, strings.SplitN(l, ".", 2)[0])
				continue
			}
			c.requires[fn] = append(c.requires[fn], r)
		}
	}
}

// requirement resolves an annotation "s.mu" of fd to its operand and
// checks that the path ends at a mutex.
func (c *checker) requirement(fd *ast.FuncDecl, lock string) (requirement, bool) {
	root, path, ok := strings.Cut(lock, ".")
	if !ok {
		return requirement{}, false
	}
	var obj types.Object
	operand := -1
	if fd.Recv != nil && len(fd.Recv.List) == 1 && len(fd.Recv.List[0].Names) == 1 && fd.Recv.List[0].Names[0].Name == root {
		obj = c.info.Defs[fd.Recv.List[0].Names[0]]
	} else {
		i := 0
		for _, fl := range fd.Type.Params.List {
			for _, name := range fl.Names {
				if name.Name == root {
					obj, operand = c.info.Defs[name], i
				}
				i++
			}
			if len(fl.Names) == 0 {
				i++
			}
		}
	}
	if obj == nil {
		return requirement{}, false
	}
	t := obj.Type()
	for _, field := range strings.Split(path, ".") {
		o, _, _ := types.LookupFieldOrMethod(t, true, obj.Pkg(), field)
		v, ok := o.(*types.Var)
		if !ok || !v.IsField() {
			return requirement{}, false
		}
		t = v.Type()
	}
	if !isMutex(t) {
		return requirement{}, false
	}
	return requirement{operand: operand, root: root, path: "." + path}, true
}

// held is the set of locks held, by the text of their expression.
type held map[string]bool

func (h held) copy() held {
	n := make(held, len(h))
	for k := range h {
		n[k] = true
	}
	return n
}

// meet keeps the locks held in both.
func meet(a, b held) held {
	n := held{}
	for k := range a {
		if b[k] {
			n[k] = true
		}
	}
	return n
}

func (c *checker) checkFunc(fd *ast.FuncDecl) {
	h := held{}
	fn := c.info.Defs[fd.Name].(*types.Func)
	for _, r := range c.requires[fn] {
		h[r.root+r.path] = true
	}
	c.block(fd.Body.List, h)
}

// block walks a list of statements with the locks h held at its start and
// returns the locks held at its end, and whether control can reach it.
func (c *checker) block(list []ast.Stmt, h held) (held, bool) {
	for _, s := range list {
		var falls bool
		h, falls = c.stmt(s, h)
		if !falls {
			return h, false
		}
	}
	return h, true
}

func (c *checker) stmt(s ast.Stmt, h held) (held, bool) {
	switch s := s.(type) {
	case *ast.BlockStmt:
		return c.block(s.List, h)
	case *ast.LabeledStmt:
		return c.stmt(s.Stmt, h)
	case *ast.ExprStmt:
		if call, ok := s.X.(*ast.CallExpr); ok {
			if c.lockCall(call, h) {
				return h, true
			}
			if isPanic(call) {
				c.expr(call, h)
				return h, false
			}
		}
		c.expr(s.X, h)
	case *ast.DeferStmt:
		// A deferred unlock runs at the end: the lock stays held.
		if _, op := c.lockOp(s.Call); op == "" {
			c.expr(s.Call, h)
		}
	case *ast.GoStmt:
		for _, a := range s.Call.Args {
			c.expr(a, h)
		}
		if lit, ok := s.Call.Fun.(*ast.FuncLit); ok {
			c.block(lit.Body.List, held{})
		} else {
			c.expr(s.Call.Fun, h)
		}
	case *ast.ReturnStmt:
		for _, r := range s.Results {
			c.expr(r, h)
		}
		return h, false
	case *ast.BranchStmt:
		if s.Tok == token.FALLTHROUGH {
			return h, true
		}
		return h, false
	case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt, *ast.SwitchStmt, *ast.TypeSwitchStmt, *ast.SelectStmt:
		return c.control(s, h)
	default:
		// Assignments, declarations, sends, inc/dec: expressions only.
		ast.Inspect(s, func(n ast.Node) bool {
			if e, ok := n.(ast.Expr); ok {
				c.expr(e, h)
				return false
			}
			return true
		})
	}
	return h, true
}

// control walks a statement that branches or loops.
func (c *checker) control(s ast.Stmt, h held) (held, bool) {
	switch s := s.(type) {
	case *ast.IfStmt:
		if s.Init != nil {
			h, _ = c.stmt(s.Init, h)
		}
		c.expr(s.Cond, h)
		th, tf := c.block(s.Body.List, h.copy())
		eh, ef := h, true
		if s.Else != nil {
			eh, ef = c.stmt(s.Else, h.copy())
		}
		return join(th, tf, eh, ef)
	case *ast.ForStmt:
		if s.Init != nil {
			h, _ = c.stmt(s.Init, h)
		}
		if s.Cond != nil {
			c.expr(s.Cond, h)
		}
		c.block(s.Body.List, h.copy())
		if s.Post != nil {
			c.stmt(s.Post, h.copy())
		}
	case *ast.RangeStmt:
		c.expr(s.X, h)
		c.block(s.Body.List, h.copy())
	case *ast.SwitchStmt:
		if s.Init != nil {
			h, _ = c.stmt(s.Init, h)
		}
		if s.Tag != nil {
			c.expr(s.Tag, h)
		}
		return c.clauses(s.Body, h)
	case *ast.TypeSwitchStmt:
		if s.Init != nil {
			h, _ = c.stmt(s.Init, h)
		}
		c.stmt(s.Assign, h)
		return c.clauses(s.Body, h)
	case *ast.SelectStmt:
		return c.clauses(s.Body, h)
	}
	return h, true
}

// join merges the two ends of an if.
func join(a held, af bool, b held, bf bool) (held, bool) {
	switch {
	case af && bf:
		return meet(a, b), true
	case af:
		return a, true
	case bf:
		return b, true
	}
	return a, false
}

// clauses walks the cases of a switch or select.
func (c *checker) clauses(body *ast.BlockStmt, h held) (held, bool) {
	var out held
	falls, hasDefault := false, false
	for _, cl := range body.List {
		var list []ast.Stmt
		switch cl := cl.(type) {
		case *ast.CaseClause:
			for _, e := range cl.List {
				c.expr(e, h)
			}
			hasDefault = hasDefault || cl.List == nil
			list = cl.Body
		case *ast.CommClause:
			if cl.Comm != nil {
				c.stmt(cl.Comm, h)
			}
			hasDefault = true // a select takes one of its cases
			list = cl.Body
		}
		ch, cf := c.block(list, h.copy())
		if cf {
			if out == nil {
				out = ch
			} else {
				out = meet(out, ch)
			}
			falls = true
		}
	}
	if !hasDefault {
		if out == nil {
			out = h
		} else {
			out = meet(out, h)
		}
		falls = true
	}
	if out == nil {
		out = h
	}
	return out, falls
}

func isPanic(call *ast.CallExpr) bool {
	id, ok := call.Fun.(*ast.Ident)
	return ok && id.Name == "panic"
}

// lockOp reports whether call is m.Lock(), m.RLock(), m.Unlock() or
// m.RUnlock() on a mutex, with m's text.
func (c *checker) lockOp(call *ast.CallExpr) (string, string) {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || len(call.Args) != 0 {
		return "", ""
	}
	t := c.info.TypeOf(sel.X)
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	if !isMutex(t) {
		return "", ""
	}
	switch sel.Sel.Name {
	case "Lock", "RLock", "Unlock", "RUnlock", "TryLock", "TryRLock":
		return types.ExprString(sel.X), sel.Sel.Name
	}
	return "", ""
}

// lockCall applies a Lock or Unlock statement to h.
func (c *checker) lockCall(call *ast.CallExpr, h held) bool {
	m, op := c.lockOp(call)
	switch op {
	case "Lock", "RLock":
		h[m] = true
	case "Unlock", "RUnlock":
		if !h[m] {
			c.report(call.Pos(), "%s.%s() without %s held", m, op, m)
		}
		delete(h, m)
	case "":
		return false
	}
	c.expr(call.Fun.(*ast.SelectorExpr).X, h)
	return true
}

// expr checks the field accesses and calls in e with the locks h held.
func (c *checker) expr(e ast.Expr, h held) {
	if e == nil {
		return
	}
	ast.Inspect(e, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			c.block(n.Body.List, h.copy())
			return false
		case *ast.SelectorExpr:
			c.access(n, h)
		case *ast.CallExpr:
			c.call(n, h)
		}
		return true
	})
}

// access checks a selector x.f of a guarded field.
func (c *checker) access(sel *ast.SelectorExpr, h held) {
	s := c.info.Selections[sel]
	if s == nil || s.Kind() != types.FieldVal {
		return
	}
	v, ok := s.Obj().(*types.Var)
	if !ok {
		return
	}
	mu, ok := c.guards[v]
	if !ok {
		return
	}
	want := types.ExprString(sel.X) + "." + mu
	if !h[want] {
		c.report(sel.Pos(), "%s is guarded by %s, not held here", types.ExprString(sel), want)
	}
}

// call checks that a call of an annotated function holds what it needs.
func (c *checker) call(call *ast.CallExpr, h held) {
	var fn *types.Func
	var recv ast.Expr
	switch f := call.Fun.(type) {
	case *ast.Ident:
		fn, _ = c.info.Uses[f].(*types.Func)
	case *ast.SelectorExpr:
		fn, _ = c.info.Uses[f.Sel].(*types.Func)
		if s := c.info.Selections[f]; s != nil && s.Kind() == types.MethodVal {
			recv = f.X
		}
	}
	if fn == nil {
		return
	}
	for _, r := range c.requires[fn] {
		var operand ast.Expr
		if r.operand < 0 {
			operand = recv
		} else if r.operand < len(call.Args) {
			operand = call.Args[r.operand]
		}
		if operand == nil {
			continue
		}
		want := types.ExprString(deref(operand)) + r.path
		if !h[want] {
			c.report(call.Pos(), "%s needs %s held (+checklocks:%s%s)", fn.Name(), want, r.root, r.path)
		}
	}
}

// deref strips a & or a * from an operand: f(&s) needs s.mu as f(s) would.
func deref(e ast.Expr) ast.Expr {
	switch x := e.(type) {
	case *ast.UnaryExpr:
		if x.Op == token.AND {
			return x.X
		}
	case *ast.StarExpr:
		return x.X
	case *ast.ParenExpr:
		return deref(x.X)
	}
	return e
}
