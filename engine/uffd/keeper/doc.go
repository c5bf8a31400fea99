// Package keeper is the process that holds copies of the userfaultfds
// the engine/uffd pager serves, so that a process whose pager is killed
// blocks on its missing pages rather than read them as zeros (see
// Keeper). It is started from the running program, through engine/helper.
package keeper
