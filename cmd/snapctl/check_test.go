package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine/check"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// checkNames are the features snapctl check reports, in its order: the
// engine's probes, then fs's FUSE check.
var checkNames = []string{"ptrace", "clone3 set_tid", "PR_SET_MM_MAP", "userfaultfd", "uffd WP_ASYNC", "PAGEMAP_SCAN", "namespaces", "TCP_REPAIR", "FUSE"}

func requireAll(t *testing.T) {
	t.Helper()
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
}

// The table: one line per feature, name, state and what needs it in
// columns, then what was seen.
func TestCheckTable(t *testing.T) {
	requireAll(t)
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"check"}, &stdout, &stderr); err != nil {
		t.Fatalf("check: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	if stderr.Len() > 0 {
		t.Errorf("stderr: %q", stderr.String())
	}
	// The facilities, a blank line, then the kernel's behaviours under a
	// heading of their own.
	table, rest, ok := strings.Cut(stdout.String(), "\n\n")
	if !ok {
		t.Fatalf("no blank line before the kernel's behaviours:\n%s", stdout.String())
	}
	checkBehaviourLines(t, rest)
	lines := strings.Split(table, "\n")
	if len(lines) != len(checkNames) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(checkNames), stdout.String())
	}
	line := regexp.MustCompile(`^(.{15}) (OK {6}|missing ) (\([^)]*\)) +\S.*$`)
	for i, l := range lines {
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("line %q is not NAME STATE (NEEDED) DETAIL in columns", l)
			continue
		}
		if name := strings.TrimSpace(m[1]); name != checkNames[i] || strings.TrimSpace(m[2]) != "OK" {
			t.Errorf("line %d: %s %s, want %s OK", i, name, m[2], checkNames[i])
		}
		if len(m[3]) > 25 || strings.Index(l, m[3]) != 25 {
			t.Errorf("line %q: what needs it is not in the third column", l)
		}
	}
}

// behaviourNames are the kernel behaviours snapctl check reports after the
// facilities, in its order.
var behaviourNames = []string{"read-fault page", "THP", "page reporting", "/ propagation", "lazy shmem"}

// checkBehaviourLines checks the behaviours' part of check's table: a
// heading, then one line per behaviour, name, what it changes and what
// was found, in the facilities' columns.
func checkBehaviourLines(t *testing.T, s string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	if len(lines) != 1+len(behaviourNames) || !strings.HasPrefix(lines[0], "kernel behaviours") {
		t.Fatalf("behaviours: want a heading and %d lines:\n%s", len(behaviourNames), s)
	}
	line := regexp.MustCompile(`^(.{15}) {10}(\([^)]*\)) +\S.*$`)
	for i, l := range lines[1:] {
		m := line.FindStringSubmatch(l)
		if m == nil || strings.TrimSpace(m[1]) != behaviourNames[i] {
			t.Errorf("behaviour line %q, want %s (WHAT IT CHANGES) DETAIL in columns", l, behaviourNames[i])
			continue
		}
		if strings.Contains(l, "unknown:") {
			t.Errorf("a probe failed: %q", l)
		}
	}
}

func TestCheckJSON(t *testing.T) {
	requireAll(t)
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"check", "--json"}, &stdout, &stderr); err != nil {
		t.Fatalf("check --json: %v\n%s", err, stderr.String())
	}
	var all, feats []check.Feature
	if err := json.Unmarshal(stdout.Bytes(), &all); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	var behaviours []string
	for _, f := range all {
		if !f.Behaviour {
			feats = append(feats, f)
			continue
		}
		behaviours = append(behaviours, f.Name)
		if !f.OK || f.Needed == "" || f.Detail == "" || strings.HasPrefix(f.Detail, "unknown") {
			t.Errorf("behaviour %+v: want OK, what it changes and what was found", f)
		}
	}
	if !reflect.DeepEqual(behaviours, behaviourNames) {
		t.Errorf("behaviours %q, want %q", behaviours, behaviourNames)
	}
	if len(feats) != len(checkNames) {
		t.Fatalf("%d features, want %d: %+v", len(feats), len(checkNames), feats)
	}
	for i, f := range feats {
		if f.Name != checkNames[i] || !f.OK || f.Needed == "" || f.Detail == "" {
			t.Errorf("feature %d: %+v, want %s OK", i, f, checkNames[i])
		}
	}
	for _, key := range []string{`"name"`, `"needed"`, `"ok"`, `"detail"`} {
		if !bytes.Contains(stdout.Bytes(), []byte(key)) {
			t.Errorf("JSON lacks %s:\n%s", key, stdout.String())
		}
	}
}

func TestCheckUsage(t *testing.T) {
	var stdout, stderr bytes.Buffer
	var ue *cli.UsageError
	if err := run(t.Context(), []string{"check", "extra"}, &stdout, &stderr); !errors.As(err, &ue) {
		t.Errorf("check extra: %v, want a usage error", err)
	}
	if err := run(t.Context(), []string{"check", "--no-such-flag"}, &stdout, &stderr); !errors.As(err, &ue) {
		t.Errorf("check --no-such-flag: %v, want a usage error", err)
	}
	if stdout.Len() > 0 {
		t.Errorf("a usage error printed to stdout: %q", stdout.String())
	}
}
