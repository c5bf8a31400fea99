// Package harness is the core of the benchmark harness: the state of one
// measuring run (Harness), the modelserver's dumps, restores and baselines
// and the weightserver's series, which every run measures, and the steps
// the other series share (a dump, a restore, a run of snapctl). The other
// series live in package main of test/bench and add themselves to
// ExtraSeries; package report holds what they all measure.
package harness
