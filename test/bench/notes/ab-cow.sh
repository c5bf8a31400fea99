#!/bin/bash
# Copy-on-write sharing across fork, off and on (cow.md quotes its output):
# the tool at 4907f4d (each restored process gets its own copy of the
# private memory it shared copy-on-write with its parent) against 084c408
# (restore forks each child from a parent whose memory is in, so those
# pages are shared again, f9a050e; the dump stores them once, d771fd6),
# built side by side from git worktrees, on two
# pre-fork servers:
#   - test/fixtures/forkpool.py: 256 MiB of data built in the parent, a
#     pool of 4 forked workers that read it all; the answer checked is the
#     16 "sum I" checksums, equal to those before the first dump;
#   - PostgreSQL 15 (Debian's): a cluster made with initdb, pgbench -i -s 10
#     once, then at each start 5 s of pgbench -c 2; the answer checked is
#     select sum(abalance) from pgbench_accounts, equal to before.
# 3 rounds; in each, for each server, off then on (interleaved): start the
# server (its own session, stdin /dev/null, no inherited fd past 2), then
#   Pss and Rss of the tree (smaps_rollup of the root and every
#   descendant, summed), snapctl dump -t ROOT (kills the tree), snapshot
#   size (du -sb), 2.5 s wait (this host's init reaps the dumped processes
#   only every ~2 s; without the wait the restore waits for their pids),
#   snapctl restore (eager), Pss/Rss of the tree, answer check;
#   the same again with snapctl restore --lazy (in the background, waited
#   for: it exits once all memory is in), Pss/Rss once it exited, check;
# then stop the server (pg_ctl stop -m fast; the fork pool's tree killed)
# and check that no process of the tree, no lazyfs mount and no System V
# segment of the cluster is left. Times are snapctl's own lines. Prints a
# RESULT line per restore and the medians at the end.
#
# usage (root, from the module root; needs git, Go at /usr/local/go/bin or
# on PATH, python3, postgresql-15):
#   bash test/bench/notes/ab-cow.sh [> out.txt]
# OFF=rev ON=rev ROUNDS=n override the commits and the number of rounds.
# Everything (worktrees, binaries, cluster, snapshots) lives in a
# temporary directory under /tmp, removed on exit, even when interrupted
# (Ctrl-C, or SIGTERM to the script: the trap kills the tree and any
# restore under way; a SIGINT sent to the script's pid alone is dropped by
# bash while a foreground child runs, as for any bash script).
set -u
export PATH=/usr/local/go/bin:$PATH
REPO=$(git rev-parse --show-toplevel) || exit 1
OFF=${OFF:-4907f4d} ON=${ON:-084c408} ROUNDS=${ROUNDS:-3}
B=/usr/lib/postgresql/15/bin
FPPORT=18391 PGPORT=54339
W=$(mktemp -d /tmp/ab-cow.XXXXXX) && chmod 755 "$W" || exit 1
PG=$W/pg
ROOTPID="" LAZYPID="" WT=""

# tree PID: PID and its descendants, parents first.
tree() { echo "$1"; local c; for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do tree "$c"; done; }
# mem PID: "PSS_KIB RSS_KIB NPROC" summed over the tree.
mem() {
  local p a b pss=0 rss=0 n=0
  for p in $(tree "$1"); do
    read -r a b < <(awk '/^Pss:/{p=$2} /^Rss:/{r=$2} END{print p+0, r+0}' /proc/"$p"/smaps_rollup 2>/dev/null)
    pss=$((pss + ${a:-0})) rss=$((rss + ${b:-0})) n=$((n + 1))
  done
  echo "$pss $rss $n"
}
# killtree PID: SIGKILL the tree (pids taken first), wait until gone.
killtree() {
  local pids p i
  pids=$(tree "$1")
  for p in $pids; do kill -9 "$p" 2>/dev/null; done
  for i in $(seq 50); do
    for p in $pids; do [ -e /proc/"$p" ] && [ "$(awk '{print $3}' /proc/"$p"/stat 2>/dev/null)" != Z ] && break; p=""; done
    [ -z "$p" ] && return 0
    sleep 0.1
  done
  echo "WARN: tree of $1 still there: $pids" >&2
}
Q() { timeout 60 su postgres -s /bin/sh -c "$B/psql -h 127.0.0.1 -p $PGPORT -Atc \"$1\" postgres" </dev/null 2>&1; }
pgstop() {
  [ -f "$PG/data/postmaster.pid" ] || return 0
  local m shm
  m=$(head -1 "$PG/data/postmaster.pid")
  shm=$(sed -n 7p "$PG/data/postmaster.pid" | awk '{print $2}')
  timeout 60 su postgres -s /bin/sh -c "$B/pg_ctl -D $PG/data -m fast -w stop" </dev/null >/dev/null 2>&1 \
    || su postgres -s /bin/sh -c "$B/pg_ctl -D $PG/data -m immediate -w stop" </dev/null >/dev/null 2>&1
  [ -n "$m" ] && [ -e /proc/"$m" ] && killtree "$m"
  # The cluster's System V segment, if its postmaster left it.
  if [ -n "$shm" ] && awk -v id="$shm" 'NR>1 && $2==id && $7==0 {f=1} END{exit !f}' /proc/sysvipc/shm; then
    ipcrm -m "$shm" && echo "removed SysV segment $shm"
  fi
  rm -f "$PG/data/postmaster.pid"
}
cleanup() {
  set +e
  trap - EXIT INT TERM
  [ -n "$LAZYPID" ] && kill -9 "$LAZYPID" 2>/dev/null && wait "$LAZYPID" 2>/dev/null
  [ -n "$ROOTPID" ] && [ -e /proc/"$ROOTPID" ] && killtree "$ROOTPID"
  pgstop
  grep " $W" /proc/mounts | awk '{print $2}' | while read -r m; do umount -l "$m"; done
  for v in off on; do [ -d "$W/$v" ] && git -C "$REPO" worktree remove --force "$W/$v"; done
  git -C "$REPO" worktree prune
  rm -rf "$W"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

# startdetached LOG CMD...: CMD in a session of its own, stdin /dev/null,
# stdout and stderr to LOG, every other descriptor closed.
startdetached() {
  local log=$1; shift
  python3 -c '
import os, sys
os.closerange(3, 65536)
if os.fork():
    sys.exit(0)
os.setsid()
os.execvp(sys.argv[1], sys.argv[1:])' "$@" </dev/null >"$log" 2>&1
}
fpsums() {
  timeout 120 python3 -c '
import socket, sys
out = []
for i in range(16):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
    s.sendall(b"sum %d\n" % i)
    f = s.makefile().readline().split()
    s.close()
    out.append(f[2] if len(f) == 4 and f[0] == "sum" and f[1] == str(i) else "?")
print(",".join(out))' "$FPPORT" 2>&1
}
answer() { if [ "$1" = forkpool ]; then fpsums; else Q "select sum(abalance) from pgbench_accounts"; fi; }

# start SERVER [nowarm]: sets ROOTPID.
start() {
  ROOTPID=""
  if [ "$1" = forkpool ]; then
    startdetached "$W/fp.log" python3 -I "$W/forkpool.py" "$FPPORT"
    for _ in $(seq 120); do grep -q '^ready' "$W/fp.log" && break; sleep 0.5; done
    ROOTPID=$(sed -n 's/^ready pid=\([0-9]*\).*/\1/p' "$W/fp.log")
  else
    startdetached "$W/pgstart.log" su postgres -s /bin/sh -c \
      "$B/pg_ctl -D $PG/data -l $PG/log -o '-p $PGPORT -k $PG -c listen_addresses=127.0.0.1' -w start"
    for _ in $(seq 120); do grep -q "server started" "$W/pgstart.log" && [ -s "$PG/data/postmaster.pid" ] && break; sleep 0.5; done
    ROOTPID=$(head -1 "$PG/data/postmaster.pid" 2>/dev/null)
    [ "${2:-}" = nowarm ] || su postgres -s /bin/sh -c "$B/pgbench -h 127.0.0.1 -p $PGPORT -c 2 -T 5 postgres" </dev/null 2>&1 | grep -E "^tps|failed" | tr '\n' ' '
    [ "${2:-}" = nowarm ] || echo
  fi
  [ -n "$ROOTPID" ] && [ -e /proc/"$ROOTPID" ]
}
stop() {
  if [ "$1" = postgres ]; then pgstop; fi
  [ -n "$ROOTPID" ] && [ -e /proc/"$ROOTPID" ] && killtree "$ROOTPID"
  ROOTPID=""
  sleep 2.5  # the killed tree reaped by init before the next start
  # snapctl's private lazyfs mount lives in a mount namespace of its own:
  # none of ours may show here (other lazyfs mounts are not this script's).
  local left; left=$(grep lazyfs /proc/mounts | grep -F " $W")
  [ -n "$left" ] && echo "WARN: lazyfs mounts of this run left: $left"
  return 0
}

# run SERVER VERSION ROUND
run() {
  local srv=$1 v=$2 r=$3 S=$W/$2/bin/snapctl ref mode pb rb nb d sz rr pa ra na ans ok
  echo "== round $r $srv $v ($(cat /proc/loadavg))"
  if ! start "$srv"; then echo "FAIL: $srv did not start"; cat "$W/fp.log" "$W/pgstart.log" 2>/dev/null; stop "$srv"; return; fi
  ref=$(answer "$srv")
  echo "answer before: $ref"
  for mode in eager lazy; do
    read -r pb rb nb < <(mem "$ROOTPID")
    rm -rf "$W/snap"
    if ! "$S" dump -t "$ROOTPID" -D "$W/snap" >"$W/dump.out" 2>&1; then
      echo "FAIL: dump ($mode):"; cat "$W/dump.out"; stop "$srv"; return
    fi
    d=$(grep '^dumped' "$W/dump.out")
    sz=$(du -sb "$W/snap" | cut -f1)
    sleep 2.5
    if [ "$mode" = eager ]; then
      "$S" restore -D "$W/snap" >"$W/restore.out" 2>&1 &
    else
      "$S" restore --lazy -D "$W/snap" >"$W/restore.out" 2>&1 &
    fi
    LAZYPID=$!
    for _ in $(seq 3000); do [ -e /proc/$LAZYPID ] && [ "$(awk '{print $3}' /proc/$LAZYPID/stat)" != Z ] || break; sleep 0.1; done
    if [ -e /proc/$LAZYPID ] && [ "$(awk '{print $3}' /proc/$LAZYPID/stat)" != Z ]; then
      echo "FAIL: restore ($mode) still running after 300 s"; kill -9 $LAZYPID
    fi
    wait $LAZYPID; local rc=$?; LAZYPID=""
    rr=$(grep '^restored' "$W/restore.out")
    if [ $rc -ne 0 ] || [ -z "$rr" ]; then
      echo "FAIL: restore ($mode) exit $rc:"; cat "$W/restore.out"; stop "$srv"; return
    fi
    read -r pa ra na < <(mem "$ROOTPID")
    ans=$(answer "$srv")
    if [ "$ans" = "$ref" ]; then ok=ok; else ok="WRONG($ans)"; fi
    echo "  $d"
    echo "  $rr"
    echo "RESULT server=$srv version=$v round=$r mode=$mode procs=$nb/$na pss_before_kib=$pb rss_before_kib=$rb" \
      "dumped=$(echo "$d" | sed -n 's/.*: \([0-9.]* [KMGT]*i*B\) of memory.*/\1/p' | tr -d ' ')" \
      "dump=$(echo "$d" | sed -n 's/.* in \([^;]*\); frozen.*/\1/p')" \
      "frozen=$(echo "$d" | sed -n 's/.*; frozen \(.*\)$/\1/p')" \
      "snap_bytes=$sz" \
      "restore=$(echo "$rr" | sed -n 's/.* of memory in \([0-9.a-zµ]*\)$/\1/p')" \
      "running=$(echo "$rr" | sed -n 's/.*running after \([0-9.a-zµ]*\),.*/\1/p')" \
      "allin=$(echo "$rr" | sed -n 's/.*all memory in after \([0-9.a-zµ]*\).*/\1/p')" \
      "pss_after_kib=$pa rss_after_kib=$ra check=$ok" | tee -a "$W/results"
  done
  stop "$srv"
}

echo "ab-cow: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), off=$(git -C "$REPO" rev-parse --short "$OFF") on=$(git -C "$REPO" rev-parse --short "$ON"), $(nproc) CPUs, $(uname -r)"
echo "uptime before: $(uptime)"
for v in off on; do
  c=$OFF; [ $v = on ] && c=$ON
  git -C "$REPO" worktree add -q --detach "$W/$v" "$c" || exit 1
  (cd "$W/$v" && go build -o bin/snapctl ./cmd/snapctl && go build -o bin/lazyfs ./cmd/lazyfs) || { echo "FAIL: build $v"; exit 1; }
done
# One fixture for both (4907f4d predates it).
git -C "$REPO" show "$ON:test/fixtures/forkpool.py" >"$W/forkpool.py" && chmod 644 "$W/forkpool.py"

mkdir -p "$PG" && chown postgres "$PG"
su postgres -s /bin/sh -c "$B/initdb -D $PG/data -A trust -U postgres" </dev/null >"$W/initdb.log" 2>&1 || { cat "$W/initdb.log"; exit 1; }
start postgres nowarm || { echo "FAIL: postgres did not start"; cat "$PG/log"; exit 1; }
su postgres -s /bin/sh -c "$B/pgbench -h 127.0.0.1 -p $PGPORT -i -s 10 postgres" </dev/null >/dev/null 2>&1
echo "postgres $(Q 'select version()' | cut -d' ' -f1-2), database $(Q "select pg_size_pretty(pg_database_size('postgres'))")"
stop postgres

for r in $(seq "$ROUNDS"); do
  for srv in forkpool postgres; do
    for v in off on; do run "$srv" "$v" "$r"; done
  done
done
echo "uptime after: $(uptime)"
echo "lazyfs mounts left by this run: $(grep lazyfs /proc/mounts | grep -cF " $W"), by others (not ours): $(grep lazyfs /proc/mounts | grep -vcF " $W")"

echo "== medians (MiB; times ms)"
python3 - "$W/results" <<'PY'
import re, statistics, sys

def ms(s):
    m = re.fullmatch(r"(?:(\d+)m)?([\d.]+)(ms|s|µs|us)", s or "")
    if not m:
        return None
    v = float(m.group(2)) * {"ms": 1, "s": 1000, "µs": 1e-3, "us": 1e-3}[m.group(3)]
    return v + int(m.group(1) or 0) * 60000

rows = [dict(kv.split("=", 1) for kv in line.split()[1:])
        for line in open(sys.argv[1]) if line.startswith("RESULT ")]

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")

print("| server | version | mode | n | Pss before | Rss before | snapshot | dump | restore / running | all in | Pss after | Rss after | checks |")
print("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")
for srv in ("forkpool", "postgres"):
    for v in ("off", "on"):
        for mode in ("eager", "lazy"):
            g = [r for r in rows if (r["server"], r["version"], r["mode"]) == (srv, v, mode)]
            if not g:
                continue
            kib = {f: med([int(r[f]) / 1024 for r in g]) for f in
                   ("pss_before_kib", "rss_before_kib", "pss_after_kib", "rss_after_kib")}
            snap = med([int(r["snap_bytes"]) / 2**20 for r in g])
            dump = med([ms(r["dump"]) for r in g])
            run = med([ms(r["restore" if mode == "eager" else "running"]) for r in g])
            allin = med([ms(r["allin"]) for r in g]) if mode == "lazy" else float("nan")
            ok = sum(r["check"] == "ok" for r in g)
            print(f"| {srv} | {v} | {mode} | {len(g)} | {kib['pss_before_kib']:.0f} | {kib['rss_before_kib']:.0f} | "
                  f"{snap:.1f} | {dump:.0f} | {run:.0f} | {allin:.0f} | "
                  f"{kib['pss_after_kib']:.0f} | {kib['rss_after_kib']:.0f} | {ok}/{len(g)} ok |")
PY
