package kernel

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Behaviours of the running kernel that change what a dump finds or how
// fast memory is placed, but never whether dump and restore work. Each is
// probed, never assumed: kernels that users run differ (so does whether a
// read fault maps the zero page, which package pagemap probes).

// THP is the transparent huge page policy, from
// /sys/kernel/mm/transparent_hugepage: the bracketed choice of each file.
type THP struct {
	Enabled     string // always, madvise or never
	Defrag      string
	UseZeroPage bool // a read fault of a huge-page range maps the huge zero page
	// Sizes are the multi-size THP sizes (hugepages-SIZE) not set to
	// "never", as "64kB=inherit".
	Sizes []string
}

// ReadTHP reads the THP policy; a kernel without THP has no such
// directory (os.ErrNotExist).
func ReadTHP() (THP, error) {
	const dir = "/sys/kernel/mm/transparent_hugepage"
	var t THP
	var err error
	if t.Enabled, err = sysChoice(filepath.Join(dir, "enabled")); err != nil {
		return t, err
	}
	if t.Defrag, err = sysChoice(filepath.Join(dir, "defrag")); err != nil {
		return t, err
	}
	if b, err := os.ReadFile(filepath.Join(dir, "use_zero_page")); err == nil {
		t.UseZeroPage = strings.TrimSpace(string(b)) == "1"
	}
	sizes, _ := filepath.Glob(filepath.Join(dir, "hugepages-*"))
	for _, d := range sizes {
		c, err := sysChoice(filepath.Join(d, "enabled"))
		if err != nil || c == "never" {
			continue
		}
		t.Sizes = append(t.Sizes, strings.TrimPrefix(filepath.Base(d), "hugepages-")+"="+c)
	}
	return t, nil
}

// sysChoice returns the bracketed word of a sysfs choice file
// ("always [madvise] never" -> "madvise").
func sysChoice(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := string(b)
	i, j := strings.IndexByte(s, '['), strings.IndexByte(s, ']')
	if i < 0 || j < i {
		return "", fmt.Errorf("%s: no [choice] in %q", path, strings.TrimSpace(s))
	}
	return s[i+1 : j], nil
}

// FreePageReporting reports whether a virtio balloon reports freed pages
// to the host (VIRTIO_BALLOON_F_REPORTING): the host then takes freed
// memory back, and the first touch of memory after it was freed is slow
// (timings swing between runs). order is the smallest block reported, as
// a page order, when the page_reporting module says.
func FreePageReporting() (on bool, order int, err error) {
	devs, err := filepath.Glob("/sys/bus/virtio/devices/*")
	if err != nil {
		return false, 0, err
	}
	const balloon, reporting = 5, 5 // virtio device id; feature bit
	for _, d := range devs {
		id, err := os.ReadFile(filepath.Join(d, "device"))
		if err != nil {
			continue
		}
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(string(id)), "0x%x", &n); err != nil || n != balloon {
			continue
		}
		// One character per feature bit, bit 0 first.
		f, err := os.ReadFile(filepath.Join(d, "features"))
		if err == nil && len(f) > reporting && f[reporting] == '1' {
			on = true
		}
	}
	if b, err := os.ReadFile("/sys/module/page_reporting/parameters/page_reporting_order"); err == nil {
		fmt.Sscanf(strings.TrimSpace(string(b)), "%d", &order)
	}
	return on, order, nil
}
