package report

import (
	"fmt"
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
)

// CodecCases are the restores of each snapshot of the series; a smoke run
// does the lazy one through the mount only.
func CodecCases(smoke bool) []RestoreCase {
	if smoke {
		return []RestoreCase{{Mode: LazyMount, Threads: DefThreads}}
	}
	return []RestoreCase{
		{Mode: Eager, Threads: DefThreads},
		{Mode: Eager, Cold: true, Threads: DefThreads},
		{Mode: LazyMount, Threads: DefThreads},
		{Mode: LazyMount, Cold: true, Threads: DefThreads},
		{Mode: lazyDirect, Threads: DefThreads},
	}
}

// CodecResult is one fixture dumped with one codec.
type CodecResult struct {
	Fixture string
	Weights string // "bf16" or "float32"
	Codec   string
	Memory  uint64 // bytes of memory in the snapshot
	Pages   uint64 // the pages file
	// WeightBytes and WeightStored: the weights' memory and the stored
	// bytes of the blocks that hold it.
	WeightBytes, WeightStored uint64
	Shuffled                  uint64 // bytes of memory in shuffled blocks
	Dump, Freeze              time.Duration
	Restores                  []*RestoreResult
}

// WeightRatio is the weights' stored bytes over their memory.
func (c *CodecResult) WeightRatio() float64 {
	if c.WeightBytes == 0 {
		return 0
	}
	return float64(c.WeightStored) / float64(c.WeightBytes)
}

func (c *CodecResult) find(k RestoreCase) *RestoreResult {
	for _, r := range c.Restores {
		if r.Case == k {
			return r
		}
	}
	return nil
}

func validateCodecs(runs int, sr *SizeResult, bad func(string, ...any)) {
	for _, c := range sr.Codecs {
		what := c.Fixture + " --codec " + c.Codec
		if c.Memory == 0 || c.Pages == 0 || c.Pages > c.Memory+c.Memory/50 {
			bad("%s: pages file %d for %d bytes of memory", what, c.Pages, c.Memory)
		}
		if c.WeightStored > c.WeightBytes+c.WeightBytes/50 {
			bad("%s: weights stored in %d bytes for %d", what, c.WeightStored, c.WeightBytes)
		}
		if (c.Codec == "lz4") != (c.Shuffled == 0) {
			bad("%s: %d bytes in shuffled blocks", what, c.Shuffled)
		}
		for _, r := range c.Restores {
			if len(r.Runs) != runs {
				bad("%s, %s: %d runs, want %d", what, r.Case, len(r.Runs), runs)
			}
			for _, run := range r.Runs {
				if run.Token <= 0 {
					bad("%s, %s: token at %s", what, r.Case, run.Token)
				}
			}
		}
	}
}

func renderCodecs(m *md, sr *SizeResult) {
	if len(sr.Codecs) == 0 {
		return
	}
	m.p("### Block codecs on model weights")
	m.p("")
	m.p("`snapctl dump --codec` on the modelserver (bf16 weights of N(0, 0.02): half its mapping) and the weightserver (float32 weights of N(0, 0.02) in 16 MiB arrays, with numpy's MADV_HUGEPAGE), each dumped once per codec. *weights* is the stored bytes of the blocks holding the weights over their memory; *token* is the time from the restore command's start to the answer of `token` (after `ping` and `touch 1`), which reads every weight: medians of the runs (range), the codecs restored back to back within each round.")
	m.p("")
	cases := CodecCases(false)
	cells := []string{"fixture", "codec", "image", "pages/memory", "weights", "dump", "frozen"}
	for _, c := range cases {
		cells = append(cells, "token, "+c.Label()+" "+c.Cache())
	}
	m.header(cells...)
	for _, c := range sr.Codecs {
		row := []string{c.Fixture + " (" + c.Weights + ")", "`" + c.Codec + "`", units.FormatSize(c.Pages),
			fmt.Sprintf("%.3f", float64(c.Pages)/float64(c.Memory)), fmt.Sprintf("%.3f", c.WeightRatio()),
			Summarize([]time.Duration{c.Dump}).String(), Summarize([]time.Duration{c.Freeze}).String()}
		for _, k := range cases {
			if r := c.find(k); r != nil {
				row = append(row, r.dist(tokenOf).String())
			} else {
				row = append(row, "—")
			}
		}
		m.row(row...)
	}
	m.p("")
}
