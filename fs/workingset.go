package fs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/workingset"
)

// wsSource is where MNT/PID/workingset reads the process's working set
// (workingset.Set) from: the snapshot directory, afresh at every open,
// since a lazy restore may record one while the mount runs.
type wsSource struct {
	dir   string
	id    image.SnapshotID
	trust bool
}

// workingSetText is MNT/PID/workingset: a comment line saying what the
// working set is, then one line per range the process touched, in the
// order it touched them: address (hex), length (bytes), time since the
// process started running. Without a usable working set, one comment line
// says why.
func (p *process) workingSetText() []byte {
	w, err := workingset.ReadDir(p.ws.dir, p.pid, p.ws.id, p.ws.trust)
	if errors.Is(err, os.ErrNotExist) {
		return []byte("# no working set\n")
	}
	if err != nil {
		return fmt.Appendf(nil, "# working set ignored: %v\n", err)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# working set of process %d: %d ranges, %d bytes, recorded over %s, stopped by %s\n# address length time\n",
		w.PID, len(w.Entries), w.Bytes(), w.Span.Round(time.Microsecond), w.Stop)
	for _, e := range w.Entries {
		fmt.Fprintf(&b, "%x %d %s\n", e.Addr, e.Len, e.At.Round(time.Microsecond))
	}
	return b.Bytes()
}
