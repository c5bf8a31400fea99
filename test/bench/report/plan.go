package report

import (
	"fmt"
	"strconv"
)

// DumpConfig is one way of writing the snapshot.
type DumpConfig struct {
	Name     string   // the snapctl option, as the report names it
	Short    string   // chart label
	Args     []string // snapctl dump flags
	Block    int64    // block size; the LZ4 baseline cuts the memory alike
	Compress bool     // LZ4 blocks allowed (false: --no-compress)
	Default  bool     // the default dump; the restore-latency series uses it
}

// Label names the configuration in tables: the option, marked if default.
func (c DumpConfig) Label() string {
	if c.Default {
		return "`" + c.Name + "` (default)"
	}
	return "`" + c.Name + "`"
}

// DumpConfigs returns the configurations in report order.
func DumpConfigs() []DumpConfig {
	return []DumpConfig{
		{Name: "--no-compress", Short: "no-compress", Args: []string{"--no-compress"}, Block: 256 << 10},
		{Name: "--compress (4 KiB)", Short: "4K", Args: []string{"--compress"}, Block: 4 << 10, Compress: true},
		{Name: "--compress-block 256K", Short: "256K", Args: []string{"--compress-block", "256K"}, Block: 256 << 10, Compress: true, Default: true},
		{Name: "--compress-block 512K", Short: "512K", Args: []string{"--compress-block", "512K"}, Block: 512 << 10, Compress: true},
		{Name: "--compress-block 1M", Short: "1M", Args: []string{"--compress-block", "1M"}, Block: 1 << 20, Compress: true},
		{Name: "--compress-block 4M", Short: "4M", Args: []string{"--compress-block", "4M"}, Block: 4 << 20, Compress: true},
	}
}

// MeasureOrder is the order configurations are measured in: the default
// first (it carries the most runs and builds the raw memory file), then
// the others in report order.
func MeasureOrder(cfgs []DumpConfig) []DumpConfig {
	var out []DumpConfig
	for _, c := range cfgs {
		if c.Default {
			out = append(out, c)
		}
	}
	for _, c := range cfgs {
		if !c.Default {
			out = append(out, c)
		}
	}
	return out
}

// RestoreMode is how a snapshot is restored.
type RestoreMode int

const (
	Eager      RestoreMode = iota // snapctl restore
	LazyMount                     // snapctl restore --lazy --source mount
	lazyDirect                    // snapctl restore --lazy --source direct
)

func (m RestoreMode) String() string {
	switch m {
	case Eager:
		return "eager"
	case LazyMount:
		return "lazy, --source mount"
	case lazyDirect:
		return "lazy, --source direct"
	}
	return "mode" + strconv.Itoa(int(m))
}

// RestoreCase is one restore measurement of a snapshot.
type RestoreCase struct {
	Mode    RestoreMode
	Cold    bool // page cache dropped right before the command
	Idle    bool // lazy: no request until every page is in
	Threads int  // --decompress-threads
	// TokenFirst: the client asks ping, then token, and no touch 1: a
	// forward pass as the first real request.
	TokenFirst bool
}

// Lazy reports whether the case restores with --lazy.
func (c RestoreCase) Lazy() bool { return c.Mode != Eager }

// Cache names the page-cache state.
func (c RestoreCase) Cache() string {
	if c.Cold {
		return "cold"
	}
	return "warm"
}

// Label names the case in the report.
func (c RestoreCase) Label() string {
	s := c.Mode.String()
	if c.Idle {
		s += ", idle"
	}
	if c.TokenFirst {
		s += ", token first"
	}
	return s
}

// Args are the snapctl restore arguments.
func (c RestoreCase) Args(dir string) []string {
	a := []string{"restore", "-D", dir, "--decompress-threads", strconv.Itoa(c.Threads)}
	switch c.Mode {
	case LazyMount:
		a = append(a, "--lazy", "--source", "mount")
	case lazyDirect:
		a = append(a, "--lazy", "--source", "direct")
	}
	return a
}

func (c RestoreCase) String() string {
	return fmt.Sprintf("%s %s threads=%d", c.Label(), c.Cache(), c.Threads)
}

// DefThreads is snapctl restore's --decompress-threads default (0:
// automatic), which every series restores with unless it varies it.
const DefThreads = 0

// RestoreCases returns the restore measurements of a configuration: eager
// and lazy through the mount, cold and warm, for every configuration (the
// block-size series); for the default one also --source direct, idle lazy
// restores, and --decompress-threads 1 and 2 (0, automatic, is the
// default).
func RestoreCases(cfg DumpConfig) []RestoreCase {
	cs := []RestoreCase{
		{Mode: Eager, Threads: DefThreads},
		{Mode: Eager, Cold: true, Threads: DefThreads},
		{Mode: LazyMount, Threads: DefThreads},
		{Mode: LazyMount, Cold: true, Threads: DefThreads},
	}
	if !cfg.Default {
		return cs
	}
	cs = append(cs,
		RestoreCase{Mode: lazyDirect, Threads: DefThreads},
		RestoreCase{Mode: lazyDirect, Cold: true, Threads: DefThreads},
		RestoreCase{Mode: LazyMount, Idle: true, Threads: DefThreads},
		RestoreCase{Mode: lazyDirect, Idle: true, Threads: DefThreads},
	)
	for _, n := range []int{1, 2} {
		cs = append(cs,
			RestoreCase{Mode: Eager, Threads: n},
			RestoreCase{Mode: LazyMount, Threads: n},
			RestoreCase{Mode: lazyDirect, Threads: n},
		)
	}
	return cs
}
