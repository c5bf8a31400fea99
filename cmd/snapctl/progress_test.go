package main

import (
	"strings"
	"testing"
	"time"
)

// TestProgressRepaints: a fill that reports every block repaints the line
// at most ten times a second, with rate and time left, not before the
// delay, and ends it once; a quick one prints nothing.
func TestProgressRepaints(t *testing.T) {
	var b strings.Builder
	now := time.Unix(1000, 0)
	p := newProgress(&b, "restore", time.Second, func() time.Time { return now })
	const total = 4 << 30
	// 4 GiB in 4 s, reported every 256 KiB (16384 reports) as a fill does.
	for done := uint64(0); done < total; done += 256 << 10 {
		now = now.Add(4 * time.Second / 16384)
		p.report(done, total)
	}
	p.report(total, total)
	p.report(total, total) // reported twice: one end
	out := b.String()
	repaints := strings.Count(out, "\r")
	// 3 s after the delay at ten a second, and the last.
	if repaints < 25 || repaints > 32 {
		t.Errorf("%d repaints for 3 s shown, want about 31", repaints)
	}
	if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
		t.Errorf("want one final newline:\n%q", out)
	}
	last := out[strings.LastIndex(out, "\r")+1:]
	if !strings.Contains(last, "4 GiB of 4 GiB (100%), 1 GiB/s") {
		t.Errorf("last line %q: want the total and the rate", last)
	}
	if first := out[1 : strings.Index(out[1:], "\r")+1]; !strings.Contains(first, "/s, ") || !strings.Contains(first, "s left") {
		t.Errorf("first line %q: want the rate and the time left", first)
	}

	// The next process of a tree: a line of its own, ended too.
	b.Reset()
	for done := uint64(0); done <= 1<<30; done += 64 << 20 {
		now = now.Add(50 * time.Millisecond)
		p.report(done, 1<<30)
	}
	if out := b.String(); strings.Count(out, "\n") != 1 || !strings.Contains(out, "1 GiB of 1 GiB (100%)") {
		t.Errorf("a second total: want a line of its own, ended:\n%q", out)
	}

	b.Reset()
	now = time.Unix(2000, 0)
	q := newProgress(&b, "dump", time.Second, func() time.Time { return now })
	q.report(1<<20, 2<<20)
	now = now.Add(500 * time.Millisecond)
	q.report(2<<20, 2<<20)
	if b.Len() != 0 {
		t.Errorf("a dump done in half a second printed %q", b.String())
	}
}
