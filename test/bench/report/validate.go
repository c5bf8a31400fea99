package report

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrInsane is returned when a measurement contradicts itself or another:
// the harness refuses to write a report from it.
var ErrInsane = errors.New("implausible measurement")

// Validate checks that every measurement of rep is present and plausible.
func Validate(rep *Report) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrInsane))
	}
	if len(rep.Sizes) == 0 {
		bad("no size measured")
	}
	for _, s := range rep.Sizes {
		if len(s.Dumps) > 0 || len(rep.Only) == 0 {
			validateSize(rep.Runs, s, bad)
		}
		if len(s.Weights) > 0 || len(rep.Only) == 0 {
			validateWeights(rep.Runs, s, bad)
		}
		for _, x := range extraSections {
			x.Validate(rep.Runs, s, bad)
		}
	}
	return errors.Join(errs...)
}

func validateSize(runs int, s *SizeResult, bad func(string, ...any)) {
	positive := func(what string, ds ...time.Duration) {
		if len(ds) != runs {
			bad("%s: %d runs, want %d", what, len(ds), runs)
		}
		for _, d := range ds {
			if d <= 0 {
				bad("%s: %v", what, d)
			}
		}
	}
	if s.Memory < s.Size {
		bad("memory in the snapshot %d below the fixture's size %d", s.Memory, s.Size)
	}
	cfgs := DumpConfigs()
	if len(s.Dumps) != len(cfgs) {
		bad("%d dump series, want %d", len(s.Dumps), len(cfgs))
		return
	}
	var raw uint64
	for i, d := range s.Dumps {
		name := d.Config.Name
		if d.Config.Short != cfgs[i].Short {
			bad("dump series %d is %s, want %s", i, name, cfgs[i].Name)
		}
		positive("dump "+name, d.Wall...)
		positive("dump "+name+" in", d.Total...)
		positive("dump "+name+" frozen", d.Freeze...)
		for r := range min(len(d.Wall), len(d.Total), len(d.Freeze)) {
			if d.Freeze[r] > d.Total[r]+time.Millisecond || d.Total[r] > d.Wall[r] {
				bad("dump %s run %d: frozen %v, in %v, wall %v out of order", name, r, d.Freeze[r], d.Total[r], d.Wall[r])
			}
		}
		if d.Pages == 0 || d.Image < d.Pages || d.Pages > s.Memory {
			bad("dump %s: image %d, pages %d, memory %d", name, d.Image, d.Pages, s.Memory)
		}
		if d.Ratio <= 0 || d.Ratio > 1.05 {
			bad("dump %s: ratio %.3f", name, d.Ratio)
		}
		if d.Config.Compress != (d.LZ4 > 0) {
			bad("dump %s: lz4 file size %d", name, d.LZ4)
		}
		if !d.Config.Compress {
			raw = d.Pages
		}
	}
	for _, d := range s.Dumps {
		if d.Config.Compress && d.Pages >= raw {
			bad("dump %s: pages file %d not smaller than --no-compress's %d", d.Config.Name, d.Pages, raw)
		}
	}

	for _, cfg := range cfgs {
		validateRestores(runs, s, cfg, bad)
		validateBaselines(s, cfg, bad, positive)
	}
}

// validateRestores checks the restores of one dump configuration.
func validateRestores(runs int, s *SizeResult, cfg DumpConfig, bad func(string, ...any)) {
	for _, c := range RestoreCases(cfg) {
		r := s.find(cfg.Short, c)
		what := cfg.Short + " " + c.String()
		if r == nil {
			bad("restore %s missing", what)
			continue
		}
		if len(r.Runs) != runs {
			bad("restore %s: %d runs, want %d", what, len(r.Runs), runs)
		}
		for i, run := range r.Runs {
			if msg := checkRun(c, run); msg != "" {
				bad("restore %s run %d: %s", what, i, msg)
			}
		}
	}
}

// validateBaselines checks the read and lz4 baselines of one dump
// configuration; positive checks a figure's runs.
func validateBaselines(s *SizeResult, cfg DumpConfig, bad func(string, ...any), positive func(string, ...time.Duration)) {
	read := s.baseline(cfg.Short, ReadPages)
	if read == nil {
		bad("read baseline %s missing", cfg.Short)
	} else {
		positive("read baseline "+cfg.Short+" cold", read.Cold...)
		positive("read baseline "+cfg.Short+" warm", read.Warm...)
	}
	if (s.baseline(cfg.Short, LZ4Checked) != nil) != cfg.Default {
		bad("lz4 baseline with checksum for %s: want it for the default option only", cfg.Short)
	}
	lz := s.baseline(cfg.Short, LZ4Decode)
	switch {
	case !cfg.Compress && lz != nil:
		bad("lz4 baseline for %s", cfg.Short)
	case cfg.Compress && lz == nil:
		bad("lz4 baseline %s missing", cfg.Short)
	case lz != nil:
		positive("lz4 baseline "+cfg.Short+" cold", lz.Cold...)
		positive("lz4 baseline "+cfg.Short+" warm", lz.Warm...)
		if lz.Output != s.Memory || lz.Bytes == 0 {
			bad("lz4 baseline %s: %d bytes in, %d out, memory %d", cfg.Short, lz.Bytes, lz.Output, s.Memory)
		}
	}
}

// validateWeights checks the weightserver series of a size.
func validateWeights(runs int, s *SizeResult, bad func(string, ...any)) {
	if len(s.Weights) != len(WeightAdvices) {
		bad("%d weightserver series, want %d", len(s.Weights), len(WeightAdvices))
		return
	}
	for i, w := range s.Weights {
		if w.Advice != WeightAdvices[i] {
			bad("weightserver series %d has advice %q, want %q", i, w.Advice, WeightAdvices[i])
		}
		if w.Arrays <= 0 || (w.Advice == "hugepage") != (w.HugeVMAs >= w.Arrays) || (w.Advice == "none" && w.HugeVMAs != 0) {
			bad("weightserver %s: %d arrays, %d VMAs with hg", w.Advice, w.Arrays, w.HugeVMAs)
		}
		for _, c := range WeightCases() {
			r := w.find(c)
			what := "weightserver " + w.Advice + " " + c.String()
			if r == nil {
				bad("restore %s missing", what)
				continue
			}
			if len(r.Runs) != runs {
				bad("restore %s: %d runs, want %d", what, len(r.Runs), runs)
			}
			for i, run := range r.Runs {
				if msg := checkRun(c, run); msg != "" {
					bad("restore %s run %d: %s", what, i, msg)
				}
				if run.HugeVMAs != w.HugeVMAs {
					bad("restore %s run %d: %d VMAs with hg, the original %d", what, i, run.HugeVMAs, w.HugeVMAs)
				}
			}
		}
	}
}

// checkRun returns what is wrong with one restore run, or "".
func checkRun(c RestoreCase, r RestoreRun) string {
	var msgs []string
	if r.Wall <= 0 || r.Running <= 0 || r.Total < r.Running {
		msgs = append(msgs, fmt.Sprintf("wall %v, running %v, total %v", r.Wall, r.Running, r.Total))
	}
	if r.Total > r.Wall {
		msgs = append(msgs, fmt.Sprintf("reported %v beyond the command's wall time %v", r.Total, r.Wall))
	}
	if c.Idle {
		if r.Ping != 0 || r.First != 0 || r.Token != 0 {
			msgs = append(msgs, "idle run has answers")
		}
	} else if c.TokenFirst {
		if r.Ping <= 0 || r.First != 0 || r.Token < r.Ping {
			msgs = append(msgs, fmt.Sprintf("token-first run: ping %v, touch 1 %v (not to be asked), token %v", r.Ping, r.First, r.Token))
		}
	} else if r.Ping <= 0 || r.First < r.Ping || r.Token < r.First {
		msgs = append(msgs, fmt.Sprintf("answers out of order: ping %v, touch 1 %v, token %v", r.Ping, r.First, r.Token))
	}
	if c.Lazy() && r.Faults < 0 {
		msgs = append(msgs, fmt.Sprintf("faults %d", r.Faults))
	}
	return strings.Join(msgs, "; ")
}
