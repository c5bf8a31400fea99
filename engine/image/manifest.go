package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"time"

	"github.com/lazyfs/lazyfs/engine/image/store"
)

// Manifest file name and format identity.
const (
	ManifestName    = "snapshot.json"
	manifestFormat  = "lazyfs-snapshot"
	manifestVersion = 1
	// maxManifestSize and maxStateSize bound the JSON files read.
	maxManifestSize = 16 << 20
	maxStateSize    = 256 << 20
)

// Manifest is snapshot.json.
type Manifest struct {
	Format      string             `json:"format"`
	Version     int                `json:"version"`
	Tool        string             `json:"tool"`
	Created     time.Time          `json:"created"`
	Kernel      Kernel             `json:"kernel"`
	PageSize    int                `json:"page_size"`
	BlockSize   int                `json:"block_size"`
	Compression string             `json:"compression"` // the codec: "lz4", "none", "shuffle-lz4" or "shuffle-huff"
	Processes   []ProcessEntry     `json:"processes"`
	Files       map[string]FileSum `json:"files"`
	// Features names what a reader must understand to read the snapshot
	// right, beyond version 1 of the format (sorted, each once). A reader
	// refuses a snapshot that needs a feature it does not know, as it
	// refuses another version; snapshots that need none (every snapshot
	// of version 1 written before features existed) omit the field.
	Features []string `json:"features,omitempty"`
	// Seal says how a sealed snapshot (feature "sealed") is encrypted
	// and for whom; see seal.go.
	Seal *Seal `json:"seal,omitempty"`
	// Signature says who signed a signed snapshot (feature "signed")
	// and how; see sign.go.
	Signature *Signature `json:"signature,omitempty"`
	// Parent names the snapshot an incremental snapshot (feature
	// "parent") takes its unchanged blocks from; see parent.go.
	Parent *ParentRef `json:"parent,omitempty"`
}

// knownFeatures is every feature this build reads. A change to the format
// that an older reader would misread adds a feature name here and to the
// manifests that use it (Writer.AddFeature), rather than a new version:
// changes that are independent of each other then stay so.
var knownFeatures = map[string]bool{}

// HasFeature reports whether the snapshot needs feature f.
func (m *Manifest) HasFeature(f string) bool {
	return slices.Contains(m.Features, f)
}

// Kernel identifies the kernel a snapshot was taken on.
type Kernel struct {
	Release string `json:"release"`
	Machine string `json:"machine"`
}

// ProcessEntry names the files of one process.
type ProcessEntry struct {
	PID   int    `json:"pid"`
	State string `json:"state"`
	Index string `json:"index"`
	Pages string `json:"pages"`
	// PageCRCs names the page-checksum file (FeaturePageCRC), if any.
	PageCRCs string `json:"page_crcs,omitempty"`
	// Digests names the SHA-256 of every block of a signed snapshot in
	// clear (sign.go).
	Digests string `json:"digests,omitempty"`
	// Memory figures, for listings without opening the index.
	Pages4K     uint64 `json:"pages_dumped"`
	StoredBytes uint64 `json:"stored_bytes"`
}

// FileSum is the size and CRC32C of a file of the snapshot.
type FileSum struct {
	Size   int64  `json:"size"`
	CRC32C string `json:"crc32c"`
	// SHA256 is the file's SHA-256, in a signed snapshot (but for the
	// pages files, whose blocks are authenticated one by one).
	SHA256 string `json:"sha256,omitempty"`
}

func stateName(pid int) string { return fmt.Sprintf("process-%d.json", pid) }
func indexName(pid int) string { return fmt.Sprintf("pagemap-%d.img", pid) }
func pagesName(pid int) string { return fmt.Sprintf("pages-%d.img", pid) }

var safeName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// readManifest reads and validates DIR/snapshot.json.
func readManifest(dir string) (*Manifest, error) {
	st, err := OpenStore(dir, OpenOptions{Trust: true})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	b, err := readManifestBytes(st)
	if err != nil {
		return nil, err
	}
	m, err := parseManifest(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", joinName(dir, ManifestName), err)
	}
	return m, nil
}

// readManifestBytes reads snapshot.json of the snapshot in st, checked as
// every file is (store.Store.Stat).
func readManifestBytes(st store.Store) ([]byte, error) {
	size, err := st.Stat(ManifestName)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w", st, ErrIncomplete)
		}
		return nil, err
	}
	if size > maxManifestSize {
		return nil, fmt.Errorf("%s: %w: manifest larger than %d bytes", joinName(st.String(), ManifestName), ErrCorrupt, maxManifestSize)
	}
	return readAll(st, ManifestName, size, false)
}

// parseManifest decodes and validates a manifest.
func parseManifest(b []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: manifest: %v", ErrCorrupt, err)
	}
	if m.Format != manifestFormat {
		return nil, fmt.Errorf("%w: manifest format %q", ErrBadMagic, m.Format)
	}
	if m.Version != manifestVersion {
		return nil, fmt.Errorf("%w: manifest version %d, this build reads %d", ErrVersion, m.Version, manifestVersion)
	}
	for i, f := range m.Features {
		if !knownFeatures[f] {
			return nil, fmt.Errorf("%w: the snapshot needs format feature %q, which this build does not read", ErrVersion, f)
		}
		if i > 0 && m.Features[i-1] >= f {
			return nil, fmt.Errorf("%w: manifest features not sorted and unique", ErrCorrupt)
		}
	}
	if err := checkSeal(&m); err != nil {
		return nil, err
	}
	if err := checkSignature(&m); err != nil {
		return nil, err
	}
	if err := checkParentRef(&m); err != nil {
		return nil, err
	}
	if m.PageSize != PageSize {
		return nil, fmt.Errorf("%w: page size %d", ErrCorrupt, m.PageSize)
	}
	if !validBlockSize(uint64(m.BlockSize)) {
		return nil, fmt.Errorf("%w: block size %d", ErrCorrupt, m.BlockSize)
	}
	if len(m.Processes) == 0 {
		return nil, fmt.Errorf("%w: manifest lists no process", ErrCorrupt)
	}
	seen := map[int]bool{}
	for _, p := range m.Processes {
		if p.PID <= 0 || seen[p.PID] {
			return nil, fmt.Errorf("%w: manifest process pid %d", ErrCorrupt, p.PID)
		}
		seen[p.PID] = true
		if p.PageCRCs != "" && !m.HasFeature(FeaturePageCRC) {
			return nil, fmt.Errorf("%w: process %d has page checksums, the manifest lacks feature %q", ErrCorrupt, p.PID, FeaturePageCRC)
		}
		for _, name := range p.files() {
			if !safeName.MatchString(name) || name == ManifestName {
				return nil, fmt.Errorf("%w: manifest names file %q", ErrCorrupt, name)
			}
			if _, ok := m.Files[name]; !ok {
				return nil, fmt.Errorf("%w: manifest has no size and checksum for %q", ErrCorrupt, name)
			}
		}
	}
	for name, s := range m.Files {
		if !safeName.MatchString(name) || s.Size < 0 {
			return nil, fmt.Errorf("%w: manifest file entry %q", ErrCorrupt, name)
		}
	}
	return &m, nil
}

// files returns the names of the files of p.
func (p ProcessEntry) files() []string {
	names := []string{p.State, p.Index, p.Pages}
	if p.PageCRCs != "" {
		names = append(names, p.PageCRCs)
	}
	if p.Digests != "" {
		names = append(names, p.Digests)
	}
	return names
}

// Process returns the manifest entry of pid.
func (m *Manifest) Process(pid int) (ProcessEntry, bool) {
	for _, p := range m.Processes {
		if p.PID == pid {
			return p, true
		}
	}
	return ProcessEntry{}, false
}
