package image

// FeaturePIDNS marks a snapshot of a process that lived in a pid
// namespace below the dumper's (Process.NSPID set): an older reader
// would restore it with the pid the dumper saw rather than its own.
const FeaturePIDNS = "pidns"

// FeatureNamespaces marks a snapshot of a process that lived in other
// namespaces than the dumper's besides its pid one (Process.Namespaces
// set): an older reader would look for its files in its own mount
// namespace.
const FeatureNamespaces = "namespaces"

func init() {
	knownFeatures[FeaturePIDNS] = true
	knownFeatures[FeatureNamespaces] = true
}

// OwnPID is the process's pid as it saw it: the last of NSPID, or PID
// when it lived in the dumper's pid namespace.
func (p *Process) OwnPID() int {
	if n := len(p.NSPID); n > 0 {
		return p.NSPID[n-1]
	}
	return p.PID
}

// OwnTID is the thread's id as the process saw it: the last of NSTID, or
// TID.
func (t *Thread) OwnTID() int {
	if n := len(t.NSTID); n > 0 {
		return t.NSTID[n-1]
	}
	return t.TID
}
