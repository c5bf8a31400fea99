package image

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
)

// A process from a pid namespace below the dumper's gets the pidns
// feature, which this build reads; its own ids are the innermost.
func TestPIDNSFeature(t *testing.T) {
	for _, nsPID := range [][]int{nil, {700, 12}} {
		dir := filepath.Join(t.TempDir(), "snap")
		w, err := Create(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		pw, err := w.Pages(context.Background(), 700)
		if err != nil {
			t.Fatal(err)
		}
		if err := pw.Close(); err != nil {
			t.Fatal(err)
		}
		st := &Process{PID: 700, NSPID: nsPID, Threads: []Thread{{TID: 700}, {TID: 701}}}
		if nsPID != nil {
			st.Threads[0].NSTID, st.Threads[1].NSTID = []int{700, 12}, []int{701, 13}
		}
		if err := w.WriteState(st); err != nil {
			t.Fatal(err)
		}
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
		s, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if got := s.Manifest.HasFeature(FeaturePIDNS); got != (nsPID != nil) {
			t.Errorf("ns_pid %v: feature %q %v", nsPID, FeaturePIDNS, got)
		}
		back, err := s.State(700)
		if err != nil {
			t.Fatal(err)
		}
		own, tids := 700, []int{700, 701}
		if nsPID != nil {
			own, tids = 12, []int{12, 13}
		}
		if back.OwnPID() != own || !slices.Equal([]int{back.Threads[0].OwnTID(), back.Threads[1].OwnTID()}, tids) {
			t.Errorf("ns_pid %v: own pid %d, tids %d %d", nsPID, back.OwnPID(), back.Threads[0].OwnTID(), back.Threads[1].OwnTID())
		}
	}
}
