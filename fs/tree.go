package fs

import (
	"context"
	"strconv"
	"syscall"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
)

// rootNode is the mount's root. The whole tree is built when the root is
// added (the snapshot is immutable), with persistent inodes, as go-fuse's
// zipfs does:
//
//	snapshot.json
//	PID/maps  PID/mem  PID/core  PID/process.json  PID/stats  PID/workingset
//	PID/regions/START-END-PERMS[-NAME]
type rootNode struct {
	dirNode
	manifest  []byte
	procs     []*process
	memOnly   bool // Options.memOnly: PID/mem alone
	openFlags uint32
	stats     func(p *process) []byte
}

var _ = (fusefs.NodeOnAdder)((*rootNode)(nil))

func (r *rootNode) OnAdd(ctx context.Context) {
	file := func(parent *fusefs.Inode, name string, node fusefs.InodeEmbedder) {
		parent.AddChild(name, parent.NewPersistentInode(ctx, node, fusefs.StableAttr{Mode: syscall.S_IFREG}), false)
	}
	dir := func(parent *fusefs.Inode, name string) *fusefs.Inode {
		ch := parent.NewPersistentInode(ctx, &dirNode{own: r.own}, fusefs.StableAttr{Mode: syscall.S_IFDIR})
		parent.AddChild(name, ch, false)
		return ch
	}
	file(&r.Inode, "snapshot.json", &bytesNode{own: r.own, data: r.manifest})
	for _, p := range r.procs {
		pd := dir(&r.Inode, strconv.Itoa(p.pid))
		if r.memOnly {
			file(pd, "mem", newMemNode(r.own, p, 0, p.memSize(), r.openFlags))
			continue
		}
		vmas := p.dumpedVMAs()
		file(pd, "maps", &bytesNode{own: r.own, data: formatMaps(vmas)})
		file(pd, "process.json", &bytesNode{own: r.own, data: p.json})
		file(pd, "mem", newMemNode(r.own, p, 0, p.memSize(), r.openFlags))
		file(pd, "core", &coreNode{own: r.own, proc: p, openFlags: r.openFlags})
		file(pd, "stats", &genNode{own: r.own, gen: func() []byte { return r.stats(p) }})
		file(pd, "workingset", &genNode{own: r.own, gen: p.workingSetText})
		rd := dir(pd, "regions")
		for _, v := range vmas {
			file(rd, regionName(v), newMemNode(r.own, p, v.Start, v.End-v.Start, r.openFlags))
		}
	}
}
