package units

import "testing"

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "256K": 256 << 10, "256k": 256 << 10, "1M": 1 << 20, "4MiB": 4 << 20, "2G": 2 << 30, "1t": 1 << 40, "0": 0, " 8K ": 8 << 10, "512B": 512} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "K", "-1", "1.5M", "12X", "99999999999T", "0x10"} {
		if v, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, v)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for in, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1 KiB", 1536: "1.5 KiB", 256 << 20: "256 MiB", 3 << 30: "3 GiB"} {
		if got := FormatSize(in); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestRange(t *testing.T) {
	r := Range{0x1000, 0x3000}
	if r.Len() != 0x2000 || (Range{5, 3}).Len() != 0 {
		t.Errorf("Len: %d, inverted %d", r.Len(), (Range{5, 3}).Len())
	}
	if !r.Contains(0x1000) || !r.Contains(0x2fff) || r.Contains(0x3000) || r.Contains(0xfff) {
		t.Error("Contains is not half-open")
	}
	if r.Overlaps(Range{0x3000, 0x4000}) || !r.Overlaps(Range{0x2fff, 0x4000}) {
		t.Error("Overlaps at the edges")
	}
	if got := r.Intersect(Range{0x2000, 0x5000}); got != (Range{0x2000, 0x3000}) {
		t.Errorf("Intersect = %v", got)
	}
	if got := r.Intersect(Range{0x4000, 0x5000}); got.Len() != 0 {
		t.Errorf("disjoint Intersect = %v, want empty", got)
	}
	if r.String() != "1000-3000" {
		t.Errorf("String = %q", r.String())
	}
}
