package check

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds/sock"
)

// neededTCP is what needs TCP_REPAIR and nft.
const neededTCP = "--tcp-established"

// checkTCPRepair turns TCP_REPAIR on and off on a TCP socket and lists
// the nftables tables with nft, the network lock of --tcp-established.
func checkTCPRepair(ctx context.Context) Feature {
	return feature("TCP_REPAIR", neededTCP, tcpRepair(ctx), "TCP_REPAIR on and off on a TCP socket; nft lists the nftables tables")
}

func tcpRepair(ctx context.Context) error {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(s)
	for _, v := range []int{unix.TCP_REPAIR_ON, unix.TCP_REPAIR_OFF} {
		if err := unix.SetsockoptInt(s, unix.IPPROTO_TCP, unix.TCP_REPAIR, v); err != nil {
			return fmt.Errorf("setsockopt TCP_REPAIR %d: %w", v, err)
		}
	}
	nft, err := sock.NftPath()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, nft, "list", "tables").CombinedOutput(); err != nil {
		return fmt.Errorf("nft list tables: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
