package uffd

import (
	"errors"
	"fmt"
	"testing"

	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
)

// TestErrFeaturesUnsupported: a userfaultfd without the features the
// pager needs is the kernel lacking something, as errors.ErrUnsupported
// says for ENOSYS.
func TestErrFeaturesUnsupported(t *testing.T) {
	err := fmt.Errorf("check userfaultfd 5: %w", ErrFeatures)
	if !errors.Is(err, ErrFeatures) || !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("%v: matches ErrFeatures %v, errors.ErrUnsupported %v; want both", err,
			errors.Is(err, ErrFeatures), errors.Is(err, errors.ErrUnsupported))
	}
	if errors.Is(uffdio.ErrExist, errors.ErrUnsupported) {
		t.Error("ErrExist matches errors.ErrUnsupported")
	}
}
