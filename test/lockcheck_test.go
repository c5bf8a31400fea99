package e2e

import (
	"testing"

	"github.com/lazyfs/lazyfs/test/lockcheck"
)

// TestCheckLocks checks the lock annotations of the module's packages
// (test/lockcheck): a field marked +checklocks:mu is touched only with mu
// held, and a function marked +checklocks:s.mu is called only with it held.
// The packages below are the concurrent ones whose locking must stay
// annotated: removing their annotations fails the test too.
func TestCheckLocks(t *testing.T) {
	pkgs, imp, err := lockcheck.Load("..", "./...")
	if err != nil {
		t.Fatal(err)
	}
	mustHave := map[string]bool{
		"cache": true, "engine/codec": true, "engine/lazy": true, "engine/uffd": true,
	}
	const mod = "github.com/lazyfs/lazyfs/"
	for _, p := range pkgs {
		res, err := lockcheck.Check(p, imp)
		if err != nil {
			t.Errorf("%s: %v", p.ImportPath, err)
			continue
		}
		for _, d := range res.Diagnostics {
			t.Errorf("%s: %s", p.ImportPath, d)
		}
		name := p.ImportPath[len(mod):]
		if res.Guarded > 0 {
			delete(mustHave, name)
		}
		t.Logf("%s: %d guarded fields, %d annotated functions", name, res.Guarded, res.Functions)
	}
	for name := range mustHave {
		t.Errorf("%s has no guarded field: its locking is no longer checked", name)
	}
}
