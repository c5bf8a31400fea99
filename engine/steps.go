package engine

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// StepError names the step of a dump or restore that failed.
type StepError struct {
	Step string
	Err  error
}

func (e *StepError) Error() string { return e.Step + ": " + e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

// step wraps err, if not nil and not a StepError already, in a StepError
// naming the step.
func step(name string, err error) error {
	if err == nil {
		return nil
	}
	var se *StepError
	if errors.As(err, &se) {
		return err
	}
	return &StepError{Step: name, Err: err}
}

// namedStep is one step of a dump or restore.
type namedStep struct {
	name string
	fn   func(context.Context) error
}

// Phase is a step of a dump or restore that ended, and how long it took.
type Phase struct {
	Name string
	Took time.Duration
}

// runSteps runs steps in order until one fails or ctx ends, and returns
// that error as a StepError naming the step. Each step is timed, logged
// at debug level (snapctl -v) and appended to phases: what names the
// operation ("dump", "restore").
func runSteps(ctx context.Context, log *slog.Logger, what string, steps []namedStep, phases *[]Phase) error {
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return step(s.name, err)
		}
		t0, n0 := time.Now(), ptrace.Resumes()
		err := s.fn(ctx)
		took := time.Since(t0)
		*phases = append(*phases, Phase{s.name, took})
		if err != nil {
			return step(s.name, err)
		}
		log.Debug(what+" step", "step", s.name, "took", took, "resumes", ptrace.Resumes()-n0)
	}
	return nil
}

// timed runs fn as the phase name.
func timed(phases *[]Phase, name string, fn func() error) error {
	t0 := time.Now()
	err := fn()
	*phases = append(*phases, Phase{name, time.Since(t0)})
	return err
}

// logger is l, or a logger that discards.
func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
