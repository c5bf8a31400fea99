package cli

import (
	"fmt"
	"io"
	"log/slog"
	"os"
)

// LogFlags are a command's logging options: -v (every step), --log-file
// (records appended to a file instead of standard error) and
// --log-format (text, one key=value record a line, or JSON, one object a
// line, for a log collector).
type LogFlags struct {
	verbose *bool
	file    *string
	format  *string
}

// NewLogFlags adds the logging options to fs.
func NewLogFlags(fs *FlagSet) *LogFlags {
	return &LogFlags{
		verbose: fs.Bool("v", false, "log each step"),
		file:    fs.String("log-file", "", "append the log to `FILE` instead of standard error (made 0600 if missing)"),
		format:  fs.String("log-format", "text", "log records in `FORMAT`: text (key=value) or json (an object a line)"),
	}
}

// Logger returns the logger the options ask for, writing to stderr unless
// a file was named, and a function that closes that file.
func (l *LogFlags) Logger(stderr io.Writer) (*slog.Logger, func(), error) {
	w, closeFn := stderr, func() {}
	if *l.file != "" {
		f, err := os.OpenFile(*l.file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return nil, nil, fmt.Errorf("--log-file: %w", err)
		}
		w, closeFn = f, func() { f.Close() }
	}
	opts := &slog.HandlerOptions{Level: slog.LevelWarn}
	if *l.verbose {
		opts.Level = slog.LevelDebug
	}
	switch *l.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), closeFn, nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), closeFn, nil
	}
	closeFn()
	return nil, nil, Usagef("--log-format %q: want text or json", *l.format)
}
