package report

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/lazyfs/lazyfs/test/fixture"
)

// ModuleRoot returns the directory of this module's go.mod: two levels
// above the fixture sources.
func ModuleRoot() (string, error) {
	src, err := fixture.SourceDir()
	if err != nil {
		return "", fmt.Errorf("find module: %w", err)
	}
	root := filepath.Dir(filepath.Dir(src))
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return "", fmt.Errorf("find module: %w", err)
	}
	return root, nil
}
