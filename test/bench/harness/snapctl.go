package harness

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
)

// Snapctl runs snapctl with args and returns its standard output.
func (h *Harness) Snapctl(ctx context.Context, args ...string) (string, error) {
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, h.Tools.Snapctl, args...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = &out, &errOut, h.Work
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("snapctl %q: %w\n%s%s", args, err, out.String(), errOut.String())
	}
	return out.String(), nil
}
