package fds

import (
	"errors"
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
)

func TestParseExternal(t *testing.T) {
	e, err := ParseExternal([]string{"stdio", "fd[7]", "pipe[123]", "pipe:[124]", "unix[9]", "socket:[10]"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		f    proc.FD
		want bool
	}{
		{proc.FD{Num: 1, Ino: 5}, true},
		{proc.FD{Num: 2, Ino: 5}, true},
		{proc.FD{Num: 3, Ino: 5}, false},
		{proc.FD{Num: 7, Ino: 5}, true},
		{proc.FD{Num: 8, Ino: 123}, true},
		{proc.FD{Num: 8, Ino: 124}, true},
		{proc.FD{Num: 8, Ino: 9}, true},
		{proc.FD{Num: 8, Ino: 10}, true},
		{proc.FD{Num: 8, Ino: 11}, false},
	} {
		if got := e.matches(&c.f); got != c.want {
			t.Errorf("fd %d inode %d: matches %v, want %v", c.f.Num, c.f.Ino, got, c.want)
		}
	}
	var none *External
	if none.matches(&proc.FD{Num: 1}) {
		t.Error("no --external matches fd 1")
	}
	for _, bad := range []string{"", "fd", "fd[]", "fd[-1]", "pipe[x]", "tty[1]", "stdout"} {
		if _, err := ParseExternal([]string{bad}); err == nil {
			t.Errorf("ParseExternal(%q) accepted", bad)
		}
	}
	if err := e.checkUsed([]int{42}, map[string]bool{"fd[7]": true, "ino[123]": true, "ino[124]": true, "ino[9]": true}); err == nil ||
		!strings.Contains(err.Error(), "inode 10") || !strings.Contains(err.Error(), "pid 42") {
		t.Errorf("an unused inode: %v", err)
	}
}

func TestParseInherit(t *testing.T) {
	m, err := ParseInherit([]string{"fd[1]:pipe:[77]", "fd[2]:fd[3]", "fd[0]:socket:[8]"})
	if err != nil {
		t.Fatal(err)
	}
	if m["pipe:[77]"] != 1 || m["fd[3]"] != 2 || m["socket:[8]"] != 0 || len(m) != 3 {
		t.Errorf("ParseInherit: %v", m)
	}
	for _, bad := range [][]string{{"1:pipe:[77]"}, {"fd[1]"}, {"fd[1]:"}, {"fd[1]:/etc/passwd"}, {"fd[999999]:pipe:[1]"}, {"fd[1]:fd[3]", "fd[2]:fd[3]"}} {
		if _, err := ParseInherit(bad); err == nil {
			t.Errorf("ParseInherit(%q) accepted", bad)
		}
	}
}

func TestCheckExternal(t *testing.T) {
	same := 1
	fds := []image.FD{
		{FD: 0, Kind: image.FDFile},
		{FD: 1, Kind: image.FDPipe, External: "pipe:[77]"},
		{FD: 2, Kind: image.FDPipe, External: "pipe:[77]", SameAs: &same},
	}
	err := CheckExternal([]*image.Process{{PID: 9, FDs: fds}}, RestoreOptions{})
	if !errors.Is(err, ErrExternal) || !errors.Is(err, image.ErrUnsupported) {
		t.Fatalf("no --inherit-fd: %v", err)
	}
	for _, want := range []string{"fd 1 of pid 9", "pipe:[77]", "--inherit-fd", "--external-fallback null"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	for _, o := range []RestoreOptions{
		{Inherit: map[string]int{"pipe:[77]": 1}},
		{Inherit: map[string]int{"fd[1]": 1}},
		{ExternalFallback: ExternalNull},
	} {
		if err := CheckExternal([]*image.Process{{PID: 9, FDs: fds}}, o); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
	if err := CheckExternal([]*image.Process{{PID: 9, FDs: fds}}, RestoreOptions{Inherit: map[string]int{"pipe:[77]": 1, "pipe:[78]": 3}}); err == nil || !strings.Contains(err.Error(), "pipe:[78]") {
		t.Errorf("an --inherit-fd for no descriptor: %v", err)
	}
	// A tree: the keys are checked against all its processes together.
	tree := []*image.Process{
		{PID: 9, FDs: fds},
		{PID: 10, FDs: []image.FD{{FD: 0, Kind: image.FDPipe, Tree: &image.FDTree{Shared: true}}, {FD: 1, Kind: image.FDPipe, Tree: &image.FDTree{PID: 9, FD: 1}}}},
		{PID: 11, FDs: []image.FD{{FD: 4, Kind: image.FDSocket, External: "socket:[5]"}}},
	}
	if err := CheckExternal(tree, RestoreOptions{Inherit: map[string]int{"pipe:[77]": 1}}); err == nil ||
		!strings.Contains(err.Error(), "fd 4 of pid 11") || !strings.Contains(err.Error(), "outside the tree") {
		t.Errorf("a tree whose second descriptor leading outside has no --inherit-fd: %v", err)
	}
	if err := CheckExternal(tree, RestoreOptions{Inherit: map[string]int{"pipe:[77]": 1, "socket:[5]": 2}}); err != nil {
		t.Errorf("a tree with both keys: %v", err)
	}
	if err := CheckExternal(tree, RestoreOptions{Inherit: map[string]int{"fd[1]": 1, "fd[4]": 2}}); err != nil {
		t.Errorf("a tree with both numbers: %v", err)
	}
	if err := CheckExternal(tree, RestoreOptions{Inherit: map[string]int{"pipe:[77]": 1, "socket:[5]": 2, "pipe:[78]": 3}}); err == nil ||
		!strings.Contains(err.Error(), "pipe:[78]") || !strings.Contains(err.Error(), "tree of pid 9") {
		t.Errorf("a tree with an --inherit-fd for no descriptor: %v", err)
	}
}
