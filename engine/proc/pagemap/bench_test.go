package pagemap

import (
	"testing"

	"github.com/lazyfs/lazyfs/engine/proc"
)

// BenchmarkPagemap compares the two methods on a 1 GiB anonymous mapping
// of the test process: fully populated, half populated in 64 KiB runs, and
// every other page populated (the most runs). Bytes are bytes of address
// space scanned. The memory is written once before timing.
func BenchmarkPagemap(b *testing.B) {
	const pages = 1 << 30 / proc.PageSize
	patterns := []struct {
		name  string
		touch func(i int) bool
	}{
		{"full", func(int) bool { return true }},
		{"half64k", func(i int) bool { return i/16%2 == 0 }},
		{"alternate", func(i int) bool { return i%2 == 0 }},
	}
	for _, pat := range patterns {
		b.Run(pat.name, func(b *testing.B) {
			mem := mapTestRegion(b, pages, pat.touch)
			p := openSelfPagemap(b)
			q := Query{Start: addrOf(mem), End: addrOf(mem) + pages*proc.PageSize, AnyOf: PagePresent | PageSwapped}
			methods := []struct {
				name string
				runs func(Query, []Run) ([]Run, error)
			}{{"read", p.RunsRead}, {"scan", p.RunsScan}}
			for _, m := range methods {
				b.Run(m.name, func(b *testing.B) {
					if m.name == "scan" && !p.ScanSupported() {
						b.Skip("PAGEMAP_SCAN unsupported")
					}
					var runs []Run
					b.SetBytes(pages * proc.PageSize)
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						var err error
						runs, err = m.runs(q, runs[:0])
						if err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(len(runs)), "runs")
				})
			}
		})
	}
}
