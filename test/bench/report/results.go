package report

import (
	"time"
)

// Report is everything one harness run measured.
type Report struct {
	Machine Machine
	Runs    int
	Smoke   bool
	Only    []string `json:",omitempty"` // the series measured, if not all
	Started time.Time
	Elapsed time.Duration
	Sizes   []*SizeResult
}

// SizeResult holds the measurements of one fixture size.
type SizeResult struct {
	Size      uint64          // the fixture's SIZE argument
	Memory    uint64          // bytes of memory the snapshot holds (dumped VMAs)
	Init      []time.Duration // the fixture's own start-up (init_ms)
	Dumps     []*DumpResult   // report order
	Restores  []*RestoreResult
	Baselines []*BaselineResult
	Weights   []*WeightsResult  // the weightserver, with and without MADV_HUGEPAGE
	Tree      *TreeResult       `json:",omitempty"` // the tree series (tree.go)
	Replicas  []*ReplicasResult `json:",omitempty"` // the replicas series (replicas.go)
	Codecs    []*CodecResult    `json:",omitempty"` // the codec series
	S3        *S3Result         `json:",omitempty"` // the "s3" series (s3.go)
	Crypt     *CryptResult      `json:",omitempty"` // the crypt series (crypt.go)
	PreCopy   []*PreCopyResult  `json:",omitempty"` // the "precopy" series (precopy.go)
	// Incremental is the "incremental" series (incremental.go).
	Incremental *IncrResult `json:",omitempty"`
	Elapsed     time.Duration

	// WorkingSet is the working-set series (workingset.go).
	WorkingSet []*WSResult `json:",omitempty"`
	// Torch is the PyTorch server series (torch.go), in the first size's.
	Torch *TorchResult `json:",omitempty"`
	// Huge is the 12 GiB weightserver (huge.go, -huge), in the first
	// size's.
	Huge *HugeResult `json:",omitempty"`
}

// WeightsResult is the weightserver series of one advice: its snapshot
// (the default dump option) restored as WeightCases says.
type WeightsResult struct {
	Advice   string // the fixture's ADVICE: "hugepage" or "none"
	Arrays   int    // weight arrays, each its own mapping
	Init     time.Duration
	HugeVMAs int    // VMAs with VmFlags hg in the original
	AnonHuge uint64 // the original's AnonHugePages, bytes
	Restores []*RestoreResult
}

// find returns the restore result of a case, or nil.
func (w *WeightsResult) find(c RestoreCase) *RestoreResult {
	for _, r := range w.Restores {
		if r.Case == c {
			return r
		}
	}
	return nil
}

// DumpResult is the dump series of one configuration.
type DumpResult struct {
	Config DumpConfig
	Image  uint64  // every file of the snapshot directory
	Pages  uint64  // the pages file
	Ratio  float64 // as snapctl prints it: pages file / memory
	Wall   []time.Duration
	Total  []time.Duration // snapctl's "in D"
	Freeze []time.Duration // snapctl's "frozen F"
	LZ4    uint64          // size of the lz4 CLI file of the same memory and block size; 0: none
}

// RestoreRun is one restore.
type RestoreRun struct {
	Wall    time.Duration // command start to exit
	Running time.Duration // reported: the process runs (eager: the restore's own time)
	Total   time.Duration // reported: eager "in D", lazy "all memory in after B"
	Ping    time.Duration // "ping" answered, since the command started; 0 when idle
	First   time.Duration // "touch 1" answered right after it; 0 when idle
	Token   time.Duration // "token" answered right after it; 0 when idle
	Faults  int           // lazy: faults served
	// Of the restored process once snapctl exited (weightserver runs
	// only): VMAs with VmFlags hg, and AnonHugePages in bytes.
	HugeVMAs int
	AnonHuge uint64
}

// RestoreResult is the runs of one restore case of one configuration.
type RestoreResult struct {
	Config DumpConfig
	Case   RestoreCase
	Runs   []RestoreRun
}

// dist summarises one figure of the runs.
func (r *RestoreResult) dist(f func(RestoreRun) time.Duration) Dist {
	ds := make([]time.Duration, 0, len(r.Runs))
	for _, run := range r.Runs {
		ds = append(ds, f(run))
	}
	return Summarize(ds)
}

// Figures of a restore run, for dist.
func wallOf(r RestoreRun) time.Duration    { return r.Wall }
func runningOf(r RestoreRun) time.Duration { return r.Running }
func totalOf(r RestoreRun) time.Duration   { return r.Total }
func pingOf(r RestoreRun) time.Duration    { return r.Ping }
func firstOf(r RestoreRun) time.Duration   { return r.First }
func tokenOf(r RestoreRun) time.Duration   { return r.Token }

// BaselineKind is what a baseline does with the bytes.
type BaselineKind int

const (
	ReadPages  BaselineKind = iota // cat PAGES > /dev/null
	LZ4Decode                      // lz4 -d -c FILE.lz4 > /dev/null, written with --no-frame-crc
	LZ4Checked                     // the same with lz4's xxHash32 content checksum (default option only)
)

// BaselineResult is the runs of one baseline.
type BaselineResult struct {
	Config DumpConfig
	Kind   BaselineKind
	Bytes  uint64 // bytes read from the file
	Output uint64 // bytes produced (lz4: the memory)
	Cold   []time.Duration
	Warm   []time.Duration
}

// find returns the restore result of a configuration and case, or nil.
func (s *SizeResult) find(cfg string, c RestoreCase) *RestoreResult {
	for _, r := range s.Restores {
		if r.Config.Short == cfg && r.Case == c {
			return r
		}
	}
	return nil
}

// baseline returns the baseline of a kind for a configuration, or nil.
func (s *SizeResult) baseline(cfg string, k BaselineKind) *BaselineResult {
	for _, b := range s.Baselines {
		if b.Config.Short == cfg && b.Kind == k {
			return b
		}
	}
	return nil
}
