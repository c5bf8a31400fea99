package engine

import (
	"context"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/workingset"
	"github.com/lazyfs/lazyfs/engine/mem"
	"github.com/lazyfs/lazyfs/engine/ns"
	"github.com/lazyfs/lazyfs/engine/task"
)

// refuseUnrestorable refuses, before anything is made, a tree this machine or build
// cannot restore: each process as a whole, then the descriptors leading
// outside the tree (and the keys of --inherit-fd) of all processes
// together, then the links between processes. A session or a process
// group can be recreated only if its leader is in the tree, or if it is
// the root's own one outside it (which the restored tree gets from
// snapctl). It opens the network namespace to join, if any.
func (tr *tree) refuseUnrestorable() error {
	if tr.opts.LeaveStopped && tr.opts.Source != nil {
		return fmt.Errorf("%w: a lazy restore cannot leave the processes stopped", ErrUnsupported)
	}
	if tr.opts.Source != nil && tr.opts.Lazy.Record != nil {
		if tr.snap.Sealed() {
			return fmt.Errorf("%w: %s is sealed: a working set would be written in clear beside it (the addresses its processes touched, and their memory)", ErrUnsupported, tr.snap.Dir)
		}
		if _, err := workingset.Dir(tr.snap); err != nil {
			return fmt.Errorf("record a working set: %w", err)
		}
	}
	k := tr.snap.Manifest.Kernel
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return err
	}
	if rel := unix.ByteSliceToString(u.Release[:]); k.Release != rel || k.Machine != unix.ByteSliceToString(u.Machine[:]) {
		return fmt.Errorf("%w: dumped on %s %s, this is %s: the vDSO would not match", ErrKernelMismatch, k.Release, k.Machine, rel)
	}
	switch o := tr.opts.Namespaces; {
	case o.Into != 0 && (o.PID || o.Net != ""):
		return fmt.Errorf("%w: a restore into the namespaces of a process (--into) makes none of its own (--pidns, --netns)", ErrUnsupported)
	case o.Into != 0:
		if err := o.CheckInto(); err != nil {
			return fmt.Errorf("%w: %v", ErrUnsupported, err)
		}
		var err error
		if tr.join, err = o.OpenInto(); err != nil {
			return err
		}
		if tr.intoPIDs, err = task.PIDsIn(o.Into); err != nil {
			return err
		}
	case o.Net != "" && o.Net != ns.NetNew:
		var err error
		if tr.join, err = ns.OpenNet(o.Net); err != nil {
			return err
		}
	}
	root := tr.procs[0]
	for _, r := range tr.procs {
		if err := r.refuseUnrestorable(); err != nil {
			return tr.name(r, err)
		}
	}
	if err := fds.CheckExternal(tr.sts, root.fdOptions()); err != nil {
		return err
	}
	for _, r := range tr.procs[1:] {
		st := r.st
		parent := tr.byPID[st.PPID]
		if parent == nil {
			return fmt.Errorf("%w: the snapshot holds several trees (pid %d's parent %d is not in it)", image.ErrCorrupt, st.PID, st.PPID)
		}
		name := fmt.Sprintf("pid %d (%s)", st.PID, st.Comm)
		if len(st.NSPID) != len(root.st.NSPID) {
			return fmt.Errorf("%w: %s lived in a pid namespace other than the root's", ErrUnsupported, name)
		}
		if st.SID != st.PID && st.SID != parent.st.SID {
			return fmt.Errorf("%w: %s: its session %d is neither its own nor its parent's", ErrUnsupported, name, st.SID)
		}
		if leader := tr.byPID[st.PGID]; leader != nil {
			if leader.st.SID != st.SID {
				return fmt.Errorf("%w: %s: its process group %d is in another session", ErrUnsupported, name, st.PGID)
			}
		} else if st.PGID != root.st.PGID || st.SID != root.st.SID {
			return fmt.Errorf("%w: %s: its process group %d has no leader in the tree", ErrUnsupported, name, st.PGID)
		}
	}
	if tr.lazy != nil {
		return tr.lazy.OpenSources()
	}
	return nil
}

// refuseUnrestorable refuses what this machine or build cannot restore of one
// process: ids that are taken, files that changed, descriptors it cannot
// make.
func (r *restorer) refuseUnrestorable() error {
	st := r.st
	if err := r.checkPIDs(); err != nil {
		return err
	}
	if err := task.CheckCapabilities(st); err != nil {
		return err
	}
	root := r.tr.root()
	if err := r.checkForeign(); err != nil {
		return err
	}
	if !mem.GhostOf(st.VMAs, st.Exe) {
		if err := fds.CheckFile(root, st.Exe, "executable"); err != nil {
			return r.containerHint(err)
		}
	}
	for _, v := range st.VMAs {
		if v.File != nil && v.Ghost == nil && (v.Kind == image.VMAFile || v.Kind == image.VMAFileShared) {
			if err := fds.CheckFile(root, *v.File, fmt.Sprintf("mapping %x-%x", v.Start, v.End)); err != nil {
				return r.containerHint(err)
			}
		}
	}
	o := r.tr.opts
	for _, f := range st.FDs {
		if err := fds.CheckRestorable(root, f); err != nil {
			return r.containerHint(fmt.Errorf("fd %d: %w", f.FD, err))
		}
		if s := f.Socket; s != nil && s.TCP != nil && o.TCPEstablished && (o.Namespaces.Net != "" || o.Namespaces.Into != 0) {
			// The peer and the lock are in our namespace; a copy restored
			// in another would be a second end of the same connection.
			return fmt.Errorf("%w: fd %d is a TCP connection kept by the dump (%s-%s), which lives in snapctl's network namespace with its lock: restore it without --netns or --into, or without --tcp-established (it then comes back closed)",
				ErrUnsupported, f.FD, s.Local, s.Peer)
		}
	}
	return nil
}

// root is where the processes' paths resolve: in the root directory of
// the process whose namespaces they join (Into), or ours ("").
func (tr *tree) root() string {
	if into := tr.opts.Namespaces.Into; into != 0 {
		return fmt.Sprintf("/proc/%d/root", into)
	}
	return ""
}

// checkForeign refuses, in a restore into a container's namespaces
// (Into), what snapctl would make in its own mount namespace instead:
// the deleted files it makes again, the pseudo-terminals it opens.
func (r *restorer) checkForeign() error {
	if r.tr.opts.Namespaces.Into == 0 {
		return nil
	}
	why := func(what string) error {
		return fmt.Errorf("%w: %s, which snapctl would make in its own mount namespace, not the container's: a restore with --into does not make them yet", ErrUnsupported, what)
	}
	if mem.GhostOf(r.st.VMAs, r.st.Exe) {
		return why("its executable was deleted")
	}
	for _, v := range r.st.VMAs {
		if v.Ghost != nil {
			return why(fmt.Sprintf("mapping %x-%x is of a deleted file", v.Start, v.End))
		}
	}
	for _, f := range r.st.FDs {
		switch {
		case f.Ghost != nil:
			return why(fmt.Sprintf("fd %d is a deleted file", f.FD))
		case f.Pty != nil:
			return why(fmt.Sprintf("fd %d is a pseudo-terminal", f.FD))
		}
	}
	return nil
}

// containerHint adds to a refusal of a file, for a process that lived in
// a mount namespace not snapctl's (a container's) and is not restored
// into one, that its paths were that namespace's.
func (r *restorer) containerHint(err error) error {
	if r.tr.opts.Namespaces.Into == 0 && slices.Contains(r.st.Namespaces, "mnt") {
		return fmt.Errorf("%w (the process lived in a mount namespace of its own, a container's, whose paths these are: restore it into such a container with --into PID)", err)
	}
	return err
}

// checkPIDs refuses ids that are taken, where the process is to have
// them: in our pid namespace, or in the one it joins (Into). A new one is
// empty; the ids there are the process's own view
// (image.Process.OwnPID), which a snapshot of a process in a pid
// namespace below ours can only have in one below ours too.
func (r *restorer) checkPIDs() error {
	st := r.st
	if into := r.tr.opts.Namespaces.Into; into != 0 {
		if comm, busy := r.tr.intoPIDs[st.OwnPID()]; busy {
			return fmt.Errorf("%w: pid %d is taken by %q in the pid namespace of process %d: restore into a container where it is free", ErrPIDInUse, st.OwnPID(), comm, into)
		}
		for _, th := range st.Threads {
			if comm, busy := r.tr.intoPIDs[th.OwnTID()]; busy {
				return fmt.Errorf("%w: thread id %d is taken by %q in the pid namespace of process %d", ErrPIDInUse, th.OwnTID(), comm, into)
			}
		}
		for _, z := range st.Zombies {
			if comm, busy := r.tr.intoPIDs[z.OwnPID()]; busy {
				return fmt.Errorf("%w: pid %d of an unreaped child is taken by %q in the pid namespace of process %d", ErrPIDInUse, z.OwnPID(), comm, into)
			}
		}
		return nil
	}
	if r.tr.opts.Namespaces.PID {
		return nil
	}
	if len(st.NSPID) > 0 {
		return fmt.Errorf("%w: the process lived in a pid namespace (pid %d there, %d outside): it restores into a new one (--pidns) or into a container's (--into PID) only",
			ErrUnsupported, st.OwnPID(), st.PID)
	}
	if busy, comm := task.PIDInUse(st.PID); busy {
		return fmt.Errorf("%w: pid %d is taken by %q: stop it, or restore a copy beside it in namespaces of its own (--pidns --netns new)", ErrPIDInUse, st.PID, comm)
	}
	for _, th := range st.Threads {
		if busy, comm := task.PIDInUse(th.TID); busy {
			return fmt.Errorf("%w: thread id %d is taken by %q: stop it, or restore a copy beside it in namespaces of its own (--pidns --netns new)", ErrPIDInUse, th.TID, comm)
		}
	}
	for _, z := range st.Zombies {
		if busy, comm := task.PIDInUse(z.PID); busy {
			return fmt.Errorf("%w: pid %d of an unreaped child is taken by %q: stop it, or restore a copy beside it in namespaces of its own (--pidns --netns new)", ErrPIDInUse, z.PID, comm)
		}
	}
	return nil
}

// restoreFDs recreates every descriptor (engine/fds) and closes the
// shared memory objects that mapping memory left open for them.
func (r *restorer) restoreFDs(ctx context.Context) error {
	err := fds.Restore(ctx, r.in, r.st, r.shmem, r.fdOptions())
	r.shmem = nil
	return err
}

// fdOptions are the options of the descriptors' restore.
func (r *restorer) fdOptions() fds.RestoreOptions {
	o := r.tr.opts
	return fds.RestoreOptions{Log: r.log, TCPEstablished: o.TCPEstablished, Inherit: o.Inherit, ExternalFallback: o.ExternalFallback,
		ShellJob: o.ShellJob, Tree: r.tr.broker, Foreign: o.Namespaces.Into != 0}
}
