// Package workingset is the working-set file kept beside a snapshot
// (workingset-PID.img): the memory a lazily restored process touched
// first, in the order it touched it, which a later lazy restore of the
// same snapshot fetches before anything else. It holds the format
// (workingset.go) and its reading and writing beside a snapshot
// (file.go), through engine/image's directory of the snapshot; which
// working set a restore uses, and how, is engine/lazy's.
package workingset
