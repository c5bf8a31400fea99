// Package guarded is lockcheck's test input: every line that must be
// reported says so with a want comment, and no other line may be.
package guarded

import (
	"sort"
	"sync"
)

type pending struct {
	n     int
	items []int
}

type server struct {
	mu sync.Mutex
	// +checklocks:mu
	count int
	// +checklocks:mu
	pend pending

	rw sync.RWMutex
	// +checklocks:rw
	table map[int]int

	free int // not guarded
}

// newServer touches its fields before any other goroutine sees them.
//
// +checklocksignore: construction.
func newServer() *server {
	s := &server{table: map[int]int{}}
	s.count = 1
	return s
}

func (s *server) locked() {
	s.mu.Lock()
	s.count++
	s.pend.n++
	s.mu.Unlock()
	s.count++ // want "s.count is guarded by s.mu"
	s.free++
}

func (s *server) deferred() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

func (s *server) readLock() int {
	s.rw.RLock()
	defer s.rw.RUnlock()
	return s.table[1]
}

func (s *server) wrongLock() int {
	s.rw.Lock()
	defer s.rw.Unlock()
	return s.count // want "s.count is guarded by s.mu"
}

// addLocked adds under the caller's lock.
//
// +checklocks:s.mu
func (s *server) addLocked(d int) {
	s.count += d
}

// bump needs the other server's lock.
//
// +checklocks:o.mu
func bump(s *server, o *server) {
	o.count++
	s.count++ // want "s.count is guarded by s.mu"
}

func (s *server) callers(o *server) {
	s.addLocked(1) // want "addLocked needs s.mu held"
	s.mu.Lock()
	s.addLocked(1)
	bump(o, s)
	bump(s, o) // want "bump needs o.mu held"
	s.mu.Unlock()
}

func (s *server) earlyReturn(x bool) int {
	s.mu.Lock()
	if x {
		s.mu.Unlock()
		return 0
	}
	n := s.count
	s.mu.Unlock()
	return n
}

func (s *server) branchUnlocks(x bool) {
	s.mu.Lock()
	if x {
		s.mu.Unlock()
	} else {
		s.count++
	}
	s.count++ // want "s.count is guarded by s.mu"
}

func (s *server) bothBranches(x bool) {
	if x {
		s.mu.Lock()
	} else {
		s.mu.Lock()
	}
	s.count++
	s.mu.Unlock()
}

func (s *server) switches(k int) {
	s.mu.Lock()
	switch k {
	case 0:
		s.mu.Unlock()
		return
	case 1:
		s.count++
	default:
		s.count--
	}
	s.count++
	s.mu.Unlock()
}

func (s *server) loop(xs []int) {
	for _, x := range xs {
		s.mu.Lock()
		s.count += x
		s.mu.Unlock()
	}
	s.count = 0 // want "s.count is guarded by s.mu"
}

func (s *server) closures(xs []int) {
	s.mu.Lock()
	sort.Slice(xs, func(i, j int) bool { return xs[i] < xs[j]+s.count })
	go func() {
		s.count++ // want "s.count is guarded by s.mu"
	}()
	s.mu.Unlock()
}

func (s *server) unlockUnheld() {
	s.mu.Unlock() // want "s.mu.Unlock\\(\\) without s.mu held"
}

func (s *server) panics() {
	s.mu.Lock()
	if s.count < 0 {
		s.mu.Unlock()
		panic("negative")
	}
	s.count++
	s.mu.Unlock()
}

type badField struct {
	mu sync.Mutex
	// +checklocks:nope
	x int // want "names no sync.Mutex"
}

// badFunc names a parameter it does not have.
//
// +checklocks:t.mu
func badFunc(s *server) { // want "no receiver or parameter"
	_ = s
}
