package image

// FeatureTree marks a snapshot of a process tree: several processes
// whose descriptors and shared memory refer to one another (FD.Tree,
// ShmemRef.Owner and ShmemRef.Tree). A reader that does not know these
// links would restore each process alone, with its pipes and shared
// memory cut off from the others'.
const FeatureTree = "tree"

func init() { knownFeatures[FeatureTree] = true }

// MarkTree records that the snapshot holds a process tree
// (FeatureTree).
func (w *Writer) MarkTree() { w.addFeature(FeatureTree) }

// FDTree links a descriptor of a process of a tree to the other
// processes of the tree.
type FDTree struct {
	// PID and FD, when PID is set, name the descriptor of a process
	// restored before this one (earlier in the manifest) whose open file
	// description this one shares (inherited across fork): restore hands
	// this process that very description, with its offset and flags.
	PID int `json:"pid,omitempty"`
	FD  int `json:"fd,omitempty"`
	// Shared says that this pipe or unix socket pair has ends in several
	// processes of the tree: restore creates it once and hands each
	// process its ends.
	Shared bool `json:"shared,omitempty"`
}

// Add adds the figures of another page image to s (the images of the
// processes of a tree).
func (s *Stats) Add(o Stats) {
	for _, p := range [][2]*KindStats{{&s.Zero, &o.Zero}, {&s.Raw, &o.Raw}, {&s.LZ4, &o.LZ4}, {&s.Shuffle, &o.Shuffle}, {&s.Parent, &o.Parent}, {&s.Forked, &o.Forked}, {&s.Total, &o.Total}} {
		p[0].Blocks += p[1].Blocks
		p[0].Bytes += p[1].Bytes
		p[0].Stored += p[1].Stored
	}
	s.Runs += o.Runs
	s.FileSize += o.FileSize
}
