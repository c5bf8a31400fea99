package sock

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/lazyfs/lazyfs/engine/image"
)

// NetLock holds established TCP connections still while a dump takes
// them with TCP_REPAIR and until a restore puts them back: an nftables
// table of its own (family inet, named lazyfs_PID_RANDOM) whose input and
// output chains drop every packet of each connection. Without it the
// kernel would answer the peer's next segment with a reset once the
// dumped process is gone, and the peer would reset the connection in
// turn. The table outlives the dump that kills the process (the snapshot
// names it, image.TCPConn.Lock); the restore deletes it, whether it
// brings the connections back or fails. Every other path (a failed dump,
// a dump that leaves the process running) deletes it before returning.
//
// The nft program (Debian's nftables) does the work: one batch per
// change, read from its standard input.
type NetLock struct {
	table string
	made  bool
	held  map[[2]netip.AddrPort]bool
}

// nftTimeout bounds one run of nft.
const nftTimeout = 10 * time.Second

// NewNetLock returns a lock for the connections of process pid; its table
// is made with the first connection it holds.
func NewNetLock(pid int) *NetLock {
	var b [4]byte
	rand.Read(b[:])
	return &NetLock{table: fmt.Sprintf("lazyfs_%d_%s", pid, hex.EncodeToString(b[:])), held: map[[2]netip.AddrPort]bool{}}
}

// Table returns the name of the lock's table (in family inet).
func (l *NetLock) Table() string { return l.table }

// Conns returns how many connections the lock holds.
func (l *NetLock) Conns() int { return len(l.held) }

// Hold drops, from now until Release or a restore, every packet between
// local and peer, both ways.
func (l *NetLock) Hold(local, peer netip.AddrPort) error {
	return l.HoldAll([][2]netip.AddrPort{{local, peer}})
}

// HoldAll holds each connection (local, peer) that it does not hold yet,
// with one run of nft: the first makes the table.
func (l *NetLock) HoldAll(conns [][2]netip.AddrPort) error {
	var b strings.Builder
	if !l.made {
		fmt.Fprintf(&b, "table inet %s {\n", l.table)
		fmt.Fprintf(&b, "\tchain input { type filter hook input priority -150; policy accept; }\n")
		fmt.Fprintf(&b, "\tchain output { type filter hook output priority -150; policy accept; }\n}\n")
	}
	var added [][2]netip.AddrPort
	for _, c := range conns {
		// An IPv4 address mapped in IPv6 is IPv4 on the wire.
		local := netip.AddrPortFrom(c[0].Addr().Unmap(), c[0].Port())
		peer := netip.AddrPortFrom(c[1].Addr().Unmap(), c[1].Port())
		k := [2]netip.AddrPort{local, peer}
		if l.held[k] || slices.Contains(added, k) {
			continue
		}
		if local.Addr().Is4() != peer.Addr().Is4() {
			return fmt.Errorf("lock connection %s-%s: addresses of two families", local, peer)
		}
		ip := "ip"
		if local.Addr().Is6() {
			ip = "ip6"
		}
		for _, r := range []struct {
			chain    string
			src, dst netip.AddrPort
		}{{"input", peer, local}, {"output", local, peer}} {
			fmt.Fprintf(&b, "add rule inet %s %s %s saddr %s tcp sport %d %s daddr %s tcp dport %d drop\n",
				l.table, r.chain, ip, r.src.Addr(), r.src.Port(), ip, r.dst.Addr(), r.dst.Port())
		}
		added = append(added, k)
	}
	if len(added) == 0 {
		return nil
	}
	if err := nft(b.String()); err != nil {
		return fmt.Errorf("lock %d connections (%s-%s...): %w", len(added), added[0][0], added[0][1], err)
	}
	l.made = true
	for _, k := range added {
		l.held[k] = true
	}
	return nil
}

// Release deletes the lock's table, if it made one.
func (l *NetLock) Release() error {
	if !l.made {
		return nil
	}
	if err := DeleteNetLock(l.table); err != nil {
		return err
	}
	l.made = false
	return nil
}

// lockName is the form of every table a NetLock makes.
var lockName = regexp.MustCompile(`^lazyfs_[0-9]+_[0-9a-f]{8}$`)

// DeleteNetLock deletes the nftables table of a NetLock by name (a
// snapshot's image.TCPConn.Lock); a table already gone is not an error.
// A name of another form is refused: a snapshot names no other table.
func DeleteNetLock(table string) error {
	if !lockName.MatchString(table) {
		return fmt.Errorf("network lock %q is not a table of lazyfs", table)
	}
	err := nft("delete table inet " + table + "\n")
	if err != nil && strings.Contains(err.Error(), "No such file or directory") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("release network lock %s: %w", table, err)
	}
	return nil
}

// ErrNoNft: the nft program is missing (Debian package nftables).
var ErrNoNft = fmt.Errorf("%w: nft not found (install nftables): it locks the connections of --tcp-established", errors.ErrUnsupported)

// NftPath finds the nft program: on PATH, else where Debian puts it
// (root's PATH has it, a sudo or service environment may not).
func NftPath() (string, error) {
	if p, err := exec.LookPath("nft"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/nft", "/sbin/nft"} {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", ErrNoNft
}

// nft runs one nft batch.
func nft(batch string) error {
	path, err := NftPath()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), nftTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "-f", "-")
	cmd.Stdin = strings.NewReader(batch)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("nft: %w: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// ReleaseNetLocks deletes the network locks that held the TCP connections
// of the processes sts since the dump (one lock for a whole tree): once
// they are back, or once the restore failed (their peers then see a
// reset). done remembers the locks released, so that a second call
// releases nothing twice.
func ReleaseNetLocks(sts []*image.Process, done map[string]bool, log *slog.Logger) {
	for _, st := range sts {
		for _, f := range st.FDs {
			if f.Socket == nil || f.Socket.TCP == nil || f.Socket.TCP.Lock == "" || done[f.Socket.TCP.Lock] {
				continue
			}
			lock := f.Socket.TCP.Lock
			done[lock] = true
			if err := DeleteNetLock(lock); err != nil {
				log.Error("network lock not released: nft delete table inet "+lock, "pid", st.PID, "err", err)
			}
		}
	}
}
