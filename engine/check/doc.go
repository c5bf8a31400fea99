// Package check is `snapctl check`: it tries, for real, each kernel
// facility a dump or restore needs on this machine and says for each
// whether it works and what needs it.
//
// Run starts a stub stopped (it never runs an instruction), seizes and
// injects into it (ptrace), clones a process with a chosen pid out of it
// (clone3 with set_tid), sets the stub's mm fields to their own values
// (PR_SET_MM_MAP), then opens a userfaultfd and registers a page of ours
// in it, and scans a page of ours with PAGEMAP_SCAN. Nothing it makes
// outlives the call.
//
// FUSE is the one facility it does not probe: fs owns every mount and the
// check of whether one can work (fs.CheckFUSE), and engine packages do not
// import fs; the caller turns that check's result into a Feature with
// FUSE.
package check
