package fs

import (
	"bytes"
	"fmt"

	"github.com/lazyfs/lazyfs/engine/image"
)

// statsText renders MNT/PID/stats: one figure a line, "name value", made
// when the file is opened so the cache figures are current. Byte figures
// are plain numbers (for scripts); the ratio is stored over original.
func statsText(p *process) []byte {
	var b bytes.Buffer
	st := p.r.Stats()
	line := func(name string, v any) { fmt.Fprintf(&b, "%-24s %v\n", name, v) }
	line("pid", p.pid)
	line("block_size", p.r.BlockSize())
	line("runs", st.Runs)
	for _, k := range []struct {
		name string
		s    image.KindStats
	}{{"zero", st.Zero}, {"raw", st.Raw}, {"lz4", st.LZ4}, {"shuffle", st.Shuffle}, {"parent", st.Parent}, {"forked", st.Forked}, {"total", st.Total}} {
		line("blocks_"+k.name, k.s.Blocks)
		line("original_bytes_"+k.name, k.s.Bytes)
		line("stored_bytes_"+k.name, k.s.Stored)
	}
	line("original_bytes", st.Total.Bytes)
	line("stored_bytes", st.FileSize)
	line("ratio", fmt.Sprintf("%.4f", st.Ratio()))
	cs := p.r.CacheStats()
	line("cache_hits", cs.Hits)
	line("cache_misses", cs.Misses)
	line("cache_evictions", cs.Evictions)
	line("cache_served", cs.Served)
	line("cache_entries", cs.Entries)
	line("cache_bytes", cs.Bytes)
	line("cache_max_bytes", cs.MaxBytes)
	return b.Bytes()
}
