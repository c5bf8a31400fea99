package sock

import (
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/test/testutil"
)

// TestNetLock makes a lock's table with rules for a connection over IPv4
// and one over IPv6, checks them, and deletes the table, twice.
func TestNetLock(t *testing.T) {
	testutil.RequireRoot(t)
	nftPath := testutil.RequireCommand(t, "nft")
	l := NewNetLock(4242)
	t.Cleanup(func() { l.Release() })
	if !lockName.MatchString(l.Table()) {
		t.Fatalf("table name %q", l.Table())
	}
	list := func() string {
		out, _ := exec.Command(nftPath, "list", "table", "inet", l.Table()).CombinedOutput()
		return string(out)
	}
	if err := l.Hold(netip.MustParseAddrPort("127.0.0.1:6379"), netip.MustParseAddrPort("127.0.0.1:40000")); err != nil {
		t.Fatal(err)
	}
	if err := l.Hold(netip.MustParseAddrPort("[::1]:80"), netip.MustParseAddrPort("[::ffff:10.0.0.1]:5000")); err == nil {
		t.Error("a connection between an IPv6 and an IPv4 address was locked")
	}
	if err := l.Hold(netip.MustParseAddrPort("[::ffff:127.0.0.1]:80"), netip.MustParseAddrPort("[::ffff:127.0.0.2]:5000")); err != nil {
		t.Fatal(err)
	}
	if err := l.Hold(netip.MustParseAddrPort("[::1]:80"), netip.MustParseAddrPort("[::1]:5001")); err != nil {
		t.Fatal(err)
	}
	// Held already (mapped or not): no second rule.
	if err := l.HoldAll([][2]netip.AddrPort{
		{netip.MustParseAddrPort("[::ffff:127.0.0.1]:6379"), netip.MustParseAddrPort("127.0.0.1:40000")},
		{netip.MustParseAddrPort("[::1]:80"), netip.MustParseAddrPort("[::1]:5001")},
	}); err != nil {
		t.Fatal(err)
	}
	got := list()
	if n := strings.Count(got, "drop"); n != 6 {
		t.Errorf("%d rules, want 6 (two for each of 3 connections):\n%s", n, got)
	}
	for _, want := range []string{
		"ip saddr 127.0.0.1 tcp sport 40000", "ip saddr 127.0.0.1 tcp sport 6379",
		"ip saddr 127.0.0.2 tcp sport 5000", // a mapped address is IPv4 on the wire
		"ip6 saddr ::1 tcp sport 5001", "drop",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if l.Conns() != 3 {
		t.Errorf("Conns %d, want 3", l.Conns())
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if out := list(); !strings.Contains(out, "No such file") {
		t.Errorf("table still there after Release:\n%s", out)
	}
	if err := DeleteNetLock(l.Table()); err != nil {
		t.Errorf("deleting a lock already gone: %v", err)
	}
}

func TestDeleteNetLockName(t *testing.T) {
	for _, bad := range []string{"filter", "lazyfs_1", "lazyfs_1_ABCDEF01", "lazyfs_1_abcdef01; delete table inet filter", "nat"} {
		if err := DeleteNetLock(bad); err == nil || !strings.Contains(err.Error(), "not a table of lazyfs") {
			t.Errorf("DeleteNetLock(%q): %v", bad, err)
		}
	}
}
