// Package broker holds, in snapctl, what the processes of a tree share
// through their descriptors during its restore, and hands each process
// its own descriptor on them: the pipes and socket pairs whose ends are
// in several processes, made here with the bytes that were in flight
// (MakeShared), the pseudo-terminal pairs (engine/fds/tty), the open file
// descriptions a child inherited, taken from its parent once restored
// (GiveInherited), and the shared memory objects of engine/mem. Objects
// go in and out by key (OFDKey, PipeKey, UnixKey, fds.ShmemKey, tty.PtyKey),
// and into a process by PassFD, which needs no pid of ours that the
// process can see.
//
// A Broker is the fds.Tree of a restore; engine/fds takes from it and
// never the other way.
package broker
