package image

import (
	"slices"
	"testing"
)

func TestFeaturesOfExternalFDs(t *testing.T) {
	p := &Process{FDs: []FD{{FD: 0, Kind: FDFile}}}
	if f := p.features(); len(f) != 0 {
		t.Errorf("plain descriptors need %v", f)
	}
	p.FDs = append(p.FDs, FD{FD: 1, Kind: FDPipe, External: "pipe:[1]"}, FD{FD: 3, Kind: FDSocket, Socket: &Socket{TCP: &TCPConn{}}})
	if f := p.features(); !slices.Equal(f, []string{FeatureExternalFDs, FeatureTCPRepair}) {
		t.Errorf("features %v", f)
	}
	for _, f := range p.features() {
		if !knownFeatures[f] {
			t.Errorf("feature %s unknown to this build", f)
		}
	}
}
