package e2e

import (
	"context"
	"testing"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// A Case is the setup most end-to-end tests share, as go-fuse's
// newTestCase is theirs: ptrace required, a context the test bounds
// (testContext), a fixture process (which the fixture harness kills at
// the test's cleanup, restored or not) and, once Dump ran, its snapshot in
// a directory of the test's own.
type Case struct {
	T   *testing.T
	Ctx context.Context
	P   *fixture.Proc
	// Dir and Image are the snapshot, once Dump ran.
	Dir   string
	Image *snapImage
}

// CaseOptions say what a Case starts.
type CaseOptions struct {
	Fixture string   // a program of test/fixtures, or with Python a script there
	Args    []string // the fixture's arguments
	Python  bool     // run Fixture with fixture.StartPython
}

// newCase starts the fixture prog with args, as newCaseWith does.
func newCase(t *testing.T, prog string, args ...string) *Case {
	t.Helper()
	return newCaseWith(t, CaseOptions{Fixture: prog, Args: args})
}

// newCaseWith requires ptrace, bounds the test's context and starts the
// fixture o names, ready.
func newCaseWith(t *testing.T, o CaseOptions) *Case {
	t.Helper()
	testutil.RequirePtrace(t)
	c := &Case{T: t, Ctx: testContext(t)}
	if o.Python {
		c.P = fixture.StartPython(t, o.Fixture, o.Args...)
	} else {
		c.P = fixture.Start(t, o.Fixture, o.Args...)
	}
	return c
}

// Dump dumps the process with flags (the dump kills it), waits until its
// pid is free, and returns the snapshot directory and its image, which it
// also keeps in c.Dir and c.Image.
func (c *Case) Dump(flags ...string) (string, *snapImage) {
	c.T.Helper()
	c.Dir, c.Image = dumpForRestore(c.T, c.Ctx, c.P, flags...)
	return c.Dir, c.Image
}

// Restore restores c.Dir eagerly with flags, fails the test unless the
// restore succeeds, and makes c.P control the restored process.
func (c *Case) Restore(flags ...string) cmdResult {
	c.T.Helper()
	return restoreAndAdopt(c.T, c.P, c.Dir, flags...)
}
