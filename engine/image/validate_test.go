package image

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func validState() *Process {
	one := 1
	return &Process{PID: 10, Threads: []Thread{{TID: 10}, {TID: 11}},
		VMAs: []VMA{
			{Start: 0x1000, End: 0x3000, Prot: 3, Kind: VMAAnon},
			{Start: 0x3000, End: 0x4000, Prot: 5, Kind: VMAFile, File: &FileID{Path: "/bin/x"}},
			{Start: 0x7fff0000, End: 0x7fff2000, Prot: 1, Kind: VMAVDSO},
		},
		FDs: []FD{{FD: 0, Kind: FDChr}, {FD: 1, Kind: FDChr}, {FD: 3, Kind: FDFile, SameAs: &one}},
	}
}

// The states a crafted snapshot may hold that restore cannot take: each
// refused by Validate, naming what is wrong, as ErrCorrupt.
func TestValidateRefuses(t *testing.T) {
	if err := validState().Validate(); err != nil {
		t.Fatalf("a valid state: %v", err)
	}
	minus, self := -1, 3
	for name, c := range map[string]struct {
		mutate func(p *Process)
		says   string
	}{
		"pid 0":                {func(p *Process) { p.PID = 0 }, "pid"},
		"no threads":           {func(p *Process) { p.Threads = nil }, "no threads"},
		"leader not first":     {func(p *Process) { p.Threads[0], p.Threads[1] = p.Threads[1], p.Threads[0] }, "leader"},
		"tid twice":            {func(p *Process) { p.Threads[1].TID = 10 }, "twice"},
		"tid negative":         {func(p *Process) { p.Threads[1].TID = -4 }, "thread id"},
		"VMAs overlapping":     {func(p *Process) { p.VMAs[1].Start = 0x2000 }, "overlapping"},
		"VMAs unsorted":        {func(p *Process) { p.VMAs[0], p.VMAs[2] = p.VMAs[2], p.VMAs[0] }, "out of order"},
		"VMA end before start": {func(p *Process) { p.VMAs[0].End = 0 }, "reversed"},
		"VMA empty":            {func(p *Process) { p.VMAs[0].End = p.VMAs[0].Start }, "empty"},
		"VMA unaligned":        {func(p *Process) { p.VMAs[0].Start = 0x1001 }, "aligned"},
		"VMA duplicated": {func(p *Process) {
			for range 70000 {
				p.VMAs = append(p.VMAs, p.VMAs[2])
			}
		}, "overlapping"},
		"too many VMAs": {func(p *Process) {
			p.VMAs = nil
			for i := range uint64(maxVMAs + 1) {
				p.VMAs = append(p.VMAs, VMA{Start: (i + 1) << 12, End: (i + 2) << 12, Kind: VMAAnon})
			}
		}, "more than"},
		"prot 2^40":     {func(p *Process) { p.VMAs[0].Prot = 1 << 40 }, "prot"},
		"prot negative": {func(p *Process) { p.VMAs[0].Prot = -1 }, "prot"},
		"unknown kind":  {func(p *Process) { p.VMAs[0].Kind = "heap" }, "kind"},
		"inherited outside": {func(p *Process) {
			p.VMAs[0].Inherited = []PageRange{{p.VMAs[0].End, p.VMAs[0].End + PageSize}}
		}, "inherited"},
		"semaphore over SEMVMX": {func(p *Process) {
			p.SysVIPC = &SysVIPC{Sems: []SysVSem{{SysVIPCObject: SysVIPCObject{ID: 1, Mode: 0o600}, Values: []uint16{1, 40000}}}}
		}, "semaphore 1"},
		"message type 0": {func(p *Process) {
			p.SysVIPC = &SysVIPC{Msgs: []SysVMsg{{SysVIPCObject: SysVIPCObject{ID: 1, Mode: 0o600}, Messages: []SysVMessage{{Type: 0}}}}}
		}, "type 0"},
		"fd -1":                {func(p *Process) { p.FDs[0].FD = -1 }, "descriptor -1"},
		"fd twice":             {func(p *Process) { p.FDs[1].FD = 0 }, "twice"},
		"fd huge":              {func(p *Process) { p.FDs[2].FD = maxFD }, "too high"},
		"dup of itself":        {func(p *Process) { p.FDs[2].SameAs = &self }, "dup"},
		"dup of negative":      {func(p *Process) { p.FDs[2].SameAs = &minus }, "dup"},
		"dup of a missing":     {func(p *Process) { two := 2; p.FDs[2].SameAs = &two }, "dup"},
		"nice 20":              {func(p *Process) { p.Threads[1].Sched = &Sched{Nice: 20} }, "nice"},
		"FIFO priority 0":      {func(p *Process) { p.Threads[1].Sched = &Sched{Policy: 1} }, "priority"},
		"OTHER priority 5":     {func(p *Process) { p.Threads[1].Sched = &Sched{RTPriority: 5} }, "priority"},
		"deadline policy":      {func(p *Process) { p.Threads[1].Sched = &Sched{Policy: 6} }, "policy"},
		"affinity 2048":        {func(p *Process) { p.Threads[1].Sched = &Sched{Affinity: make([]uint64, 32)} }, "affinity"},
		"ioprio class 4":       {func(p *Process) { p.Threads[1].Sched = &Sched{IOPrio: 4 << 13} }, "I/O priority"},
		"oom_score_adj":        {func(p *Process) { v := 1001; p.OOMScoreAdj = &v }, "oom_score_adj"},
		"zombie pid 0":         {func(p *Process) { p.Zombies = []Zombie{{PID: 0}} }, "unreaped child pid 0"},
		"zombie of a thread":   {func(p *Process) { p.Zombies = []Zombie{{PID: 11}} }, "unreaped child pid 11"},
		"zombie twice":         {func(p *Process) { p.Zombies = []Zombie{{PID: 12}, {PID: 12}} }, "unreaped child pid 12"},
		"zombie stopped":       {func(p *Process) { p.Zombies = []Zombie{{PID: 12, Status: 0x137f}} }, "status"},
		"zombie exit and sig":  {func(p *Process) { p.Zombies = []Zombie{{PID: 12, Status: 0x100 | 9}} }, "status"},
		"zombie by SIGCHLD":    {func(p *Process) { p.Zombies = []Zombie{{PID: 12, Status: 17}} }, "does not kill"},
		"zombie signal 65":     {func(p *Process) { p.Zombies = []Zombie{{PID: 12, Status: 65}} }, "status"},
		"zombie pidns":         {func(p *Process) { p.Zombies = []Zombie{{PID: 12, NSPID: []int{12, 3}}} }, "namespaces"},
		"lock kind":            {func(p *Process) { p.FDs[0].Locks = []Lock{{Kind: "lease", End: -1}} }, "lock"},
		"ghost of a non-ghost": {func(p *Process) { zero := 0; p.FDs[2].Kind = FDFile; p.FDs[2].Ghost = &Ghost{Of: &zero} }, "deleted file"},
		"ghost mode":           {func(p *Process) { p.FDs[2].Kind = FDFile; p.FDs[2].Ghost = &Ghost{Mode: 0o10000} }, "deleted file"},
		"lock reversed":        {func(p *Process) { p.FDs[0].Locks = []Lock{{Kind: LockPOSIX, Start: 10, End: 5}} }, "lock"},
	} {
		t.Run(name, func(t *testing.T) {
			p := validState()
			c.mutate(p)
			err := p.Validate()
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.says) {
				t.Errorf("Validate: %v, want ErrCorrupt saying %q", err, c.says)
			}
		})
	}
}

// FuzzValidate: whatever a state's JSON holds, Validate never panics, and
// a state it accepts has the shape restore relies on: the leader first,
// VMAs in order and apart, PROT_* bits only, descriptors once each.
func FuzzValidate(f *testing.F) {
	b, _ := json.Marshal(validState())
	f.Add(b)
	f.Add([]byte(`{"pid":1,"threads":[{"tid":1}],"vmas":[{"start":4096,"end":0,"kind":"anon"}]}`))
	f.Add([]byte(`{"pid":1,"threads":[{"tid":1}],"fds":[{"fd":-1}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Process
		if json.Unmarshal(b, &p) != nil || p.Validate() != nil {
			return
		}
		if len(p.Threads) == 0 || p.Threads[0].TID != p.PID {
			t.Fatalf("accepted threads %+v of pid %d", p.Threads, p.PID)
		}
		for i, v := range p.VMAs {
			if v.End <= v.Start || v.Prot&^7 != 0 || i > 0 && v.Start < p.VMAs[i-1].End {
				t.Fatalf("accepted VMA %d %+v", i, v)
			}
		}
		seen := map[int]bool{}
		for _, d := range p.FDs {
			if d.FD < 0 || seen[d.FD] {
				t.Fatalf("accepted fd %d", d.FD)
			}
			seen[d.FD] = true
		}
	})
}

// TestWriterRefusesInvalidState: a state that readers would refuse is
// never written: WriteState fails with ErrStateRefused (not ErrCorrupt: the
// snapshot is not damaged, the dump is refused), naming the process and
// what is wrong, and nothing is committed.
func TestWriterRefusesInvalidState(t *testing.T) {
	dir := t.TempDir() + "/snap"
	w, err := Create(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	p := validState()
	p.Threads = nil
	err = w.WriteState(p)
	if !errors.Is(err, ErrStateRefused) || errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "process 10: ") || !strings.Contains(err.Error(), "no threads") {
		t.Fatalf("WriteState of a state without threads: %v, want ErrStateRefused naming it", err)
	}
}

// TestZombieStatus: the statuses wait reports of an ended child are
// taken and described as a shell would.
func TestZombieStatus(t *testing.T) {
	for _, c := range []struct {
		status int
		says   string
	}{{0, "exited 0"}, {42 << 8, "exited 42"}, {15, "killed by terminated"}, {0x80 | 11, "killed by segmentation fault"}, {34, "killed by signal 34"}} {
		p := validState()
		p.Zombies = []Zombie{{PID: 12, Status: c.status}}
		if err := p.Validate(); err != nil {
			t.Errorf("status %#x: %v", c.status, err)
		}
		if got := p.Zombies[0].Describe(); got != c.says {
			t.Errorf("status %#x described as %q, want %q", c.status, got, c.says)
		}
	}
}
