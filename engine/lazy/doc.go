// Package lazy is the lazy phase of a restore: which memory of each
// restored process is served on demand through userfaultfd rather than
// written before it runs, the pagers of every process of the tree run
// together until all of it is in, the keeper that holds their
// userfaultfds, and working sets (recorded by one restore, fetched first
// by the next).
//
// The engine creates the processes; for each, Phase.Add gives a Process
// that says which blocks it leaves out of the eager fill (Skip), makes
// the process's userfaultfd (Prepare) and registers its ranges just
// before it runs (Register). Phase.OpenSources opens what each pager
// reads, at check; Phase.Serve then runs one pager per process, reading
// from the restore's image.PageSource, until every page is in or one
// fails. Shared memory objects the tree maps are served on demand too
// (shared.go): faults by each process's pager, the rest streamed once by
// snapctl through a mapping of its own (streamer.go). What the source is
// (the snapshot's files, a lazyfs mount, a private mount) is its own
// business: the pager only reads.
package lazy
