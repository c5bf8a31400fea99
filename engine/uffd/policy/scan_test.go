package policy

import "testing"

// TestScanWindow: the window below a scan doubles when the next scan
// starts inside it or right below it (a thread going down a model's
// arrays), up to ScanBelowMax, and starts again from ScanBelow when a
// scan starts above or further down.
func TestScanWindow(t *testing.T) {
	var sc Scan
	at := uint64(1 << 40)
	sc.Start(at)
	if sc.Below != ScanBelow {
		t.Fatalf("first scan: window %d, want %d", sc.Below, ScanBelow)
	}
	want := uint64(ScanBelow)
	for range 6 {
		at -= 9 << 20 // the next array below, inside the window
		sc.Start(at)
		want = min(2*want, ScanBelowMax)
		if sc.Below != want || sc.Lo != at || sc.Down != at {
			t.Fatalf("scan at %#x: %+v, want the window %d", at, sc, want)
		}
	}
	sc.Start(at + 1<<20) // above: another pattern
	if sc.Below != ScanBelow {
		t.Fatalf("scan above: window %d, want %d", sc.Below, ScanBelow)
	}
	sc.Start(at - ScanBelow - ScanBelow/2) // right below the window
	if sc.Below != 2*ScanBelow {
		t.Fatalf("scan right below the window: window %d, want %d", sc.Below, 2*ScanBelow)
	}
	at -= ScanBelow + ScanBelow/2
	sc.Start(at - 4*ScanBelow) // beyond it
	if sc.Below != ScanBelow {
		t.Fatalf("scan beyond the window: window %d, want %d", sc.Below, ScanBelow)
	}
}

// TestScanFollow: a scan fault of the run the scan started with moves its
// front only; one of another run starts a scan there.
func TestScanFollow(t *testing.T) {
	var sc Scan
	sc.Follow(0x100*PageSize, 0x104*PageSize)
	sc.Down = 0x80 * PageSize // the prefetcher went below
	sc.Follow(0x100*PageSize, 0x110*PageSize)
	if !sc.On || sc.Lo != 0x100*PageSize || sc.Front != 0x110*PageSize || sc.Down != 0x80*PageSize {
		t.Fatalf("same run: %+v", sc)
	}
	sc.Follow(0x50*PageSize, 0x54*PageSize)
	if sc.Lo != 0x50*PageSize || sc.Down != 0x50*PageSize || sc.Front != 0x54*PageSize {
		t.Fatalf("another run: %+v", sc)
	}
}
