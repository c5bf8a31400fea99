package measure

import (
	"errors"
	"testing"
	"time"
)

func TestParseDump(t *testing.T) {
	out := "dumped pid 24118 (1 threads): 294.9 MiB of memory into 211.4 MiB (ratio 0.717) in 734ms; frozen 732ms\n"
	got, err := ParseDump(out)
	if err != nil {
		t.Fatal(err)
	}
	want := DumpReport{PID: 24118, Ratio: 0.717, Total: 734 * time.Millisecond, Freeze: 732 * time.Millisecond}
	if got != want {
		t.Errorf("parseDump = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "dumped pid x (1 threads): 1 GiB of memory into 1 GiB (ratio 1) in 1s; frozen 1s", "snapctl: refused"} {
		if _, err := ParseDump(bad); !errors.Is(err, ErrOutput) {
			t.Errorf("parseDump(%q) = %v, want ErrOutput", bad, err)
		}
	}
}

func TestParseRestore(t *testing.T) {
	eagerOut := "restored pid 25451 (1 threads): 806.9 MiB of memory in 1.695s\n"
	got, err := ParseRestore(eagerOut, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := (RestoreReport{PID: 25451, Total: 1695 * time.Millisecond, Running: 1695 * time.Millisecond}); got != want {
		t.Errorf("eager = %+v, want %+v", got, want)
	}
	lazyOut := "pid 25451 running after 33ms; serving its memory\n" +
		"restored pid 25451 (1 threads): running after 25ms, all memory in after 799ms (16 KiB served on 2 faults, 806.8 MiB prefetched)\n"
	got, err = ParseRestore(lazyOut, true)
	if err != nil {
		t.Fatal(err)
	}
	if want := (RestoreReport{PID: 25451, Total: 799 * time.Millisecond, Running: 25 * time.Millisecond, Faults: 2}); got != want {
		t.Errorf("lazy = %+v, want %+v", got, want)
	}
	if _, err := ParseRestore(eagerOut, true); !errors.Is(err, ErrOutput) {
		t.Errorf("eager output read as lazy: %v", err)
	}
	if _, err := ParseRestore(lazyOut[:40], true); !errors.Is(err, ErrOutput) {
		t.Errorf("truncated lazy output: %v", err)
	}
}
