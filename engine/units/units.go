// Package units parses and formats the byte sizes that lazyfs flags take
// and its reports print, and holds Range, an address range of a process.
package units

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseSize parses a byte size: a decimal number with an optional binary
// suffix K, M, G or T (KiB, MiB... also accepted; case-insensitive), e.g.
// "4096", "256K", "1M", "4MiB".
func ParseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "IB"), "B")
	shift := 0
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		}
		if shift != 0 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("invalid size %q: want a number with an optional K, M, G or T suffix", s)
	}
	if v > (1<<62)>>shift {
		return 0, fmt.Errorf("size %q too large", s)
	}
	return v << shift, nil
}

// FormatSize formats n bytes in binary units with up to one decimal,
// e.g. "1.5 GiB", "256 KiB", "17 B".
func FormatSize(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	v := float64(n) / float64(div)
	s := strconv.FormatFloat(v, 'f', 1, 64)
	s = strings.TrimSuffix(s, ".0")
	return s + " " + string("KMGTPE"[exp]) + "iB"
}
