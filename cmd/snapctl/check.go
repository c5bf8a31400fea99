package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine/check"
	"github.com/lazyfs/lazyfs/fs"
)

func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := newFlags("check", "[--json]", `
Check that this machine can dump and restore: try each kernel facility a
restore needs, for real (ptrace on a stub it starts, clone3 with a chosen
pid, PR_SET_MM_MAP, userfaultfd, PAGEMAP_SCAN, new pid, mount and network
namespaces, TCP_REPAIR with the nft program for --tcp-established) and
FUSE for lazyfs, and say
for each whether it works and what needs it. Exits 10 if one is missing.

Then report the kernel's behaviours that change what a dump holds or how
fast a restore goes, never whether it works, each probed: what a read
fault of private anonymous memory maps (the shared zero page, or a
private page of zeros on some kernels), the transparent huge page
policy, free page reporting to a hypervisor (first touches of memory
slow, timings that swing), whether / propagates mounts to the
namespaces snapctl makes, and whether restore --lazy serves shared memory
on demand. With --json they are in the same list, marked
"behaviour": true.`,
		[]int{cli.ExitNoPrivilege}, stdout, stderr)
	asJSON := fl.Bool("json", false, "print the results as JSON")
	if err := fl.Parse(args); err != nil {
		return err
	}
	feats := append(check.Run(ctx, ""), check.FUSE(fs.CheckFUSE()))
	behaviours := check.Behaviours()
	var missing []string
	for _, f := range feats {
		if !f.OK {
			missing = append(missing, f.Name)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(append(feats, behaviours...)); err != nil {
			return err
		}
	} else {
		for _, f := range feats {
			state := "OK"
			if !f.OK {
				state = "missing"
			}
			fmt.Fprintf(stdout, "%-15s %-8s %-25s %s\n", f.Name, state, "("+f.Needed+")", f.Detail)
		}
		fmt.Fprintf(stdout, "\nkernel behaviours (they change results or speed, never whether it works):\n")
		for _, f := range behaviours {
			fmt.Fprintf(stdout, "%-15s %-8s %-25s %s\n", f.Name, "", "("+f.Needed+")", f.Detail)
		}
	}
	if len(missing) > 0 {
		return cli.WithExit(cli.ExitNoPrivilege, fmt.Errorf("check: missing %s", strings.Join(missing, ", ")))
	}
	return nil
}
