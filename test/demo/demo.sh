#!/usr/bin/env bash
# make demo: the whole tool in one minute, on a 256 MiB "model server".
#
# Starts the modelserver fixture, asks it a question, dumps it, mounts the
# snapshot with lazyfs and looks inside with ls, the maps file and xxd,
# restores it lazily through the mount, and times the first answer and the
# moment all its memory is back. Everything it creates lives in one temp
# directory, removed at the end, and every process and mount it starts is
# stopped, even on failure or Ctrl-C. Run as root (dump and restore trace
# processes); `sudo make demo` sets the machine up and builds first.
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
bin=$top/bin
size=${DEMO_SIZE:-256M}

if [ "$(id -u)" -ne 0 ]; then
	echo "demo: run as root (sudo make demo)" >&2
	exit 1
fi
for t in "$bin/snapctl" "$bin/lazyfs"; do
	[ -x "$t" ] || { echo "demo: $t missing: run make build" >&2; exit 1; }
done

work=$(mktemp -d /tmp/lazyfs-demo.XXXXXX)
pid= mnt=$work/mnt restorer=
cleanup() {
	set +e
	[ -n "$restorer" ] && kill "$restorer" 2>/dev/null && wait "$restorer" 2>/dev/null
	[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
	if grep -q " $mnt " /proc/mounts; then "$bin/lazyfs" -u "$mnt"; fi
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }
now() { date +%s%N; }
ms() { echo $(( ($2 - $1) / 1000000 )); }

# ask PORT REQUEST: one request line, one answer line; fails if the server
# does not answer.
ask() {
	exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
	printf '%s\n' "$2" >&3
	IFS= read -r -t 30 line <&3 || { exec 3<&-; return 1; }
	exec 3<&-
	printf '%s\n' "$line"
}
field() { sed -n "s/.*[[:space:]]$1=\([^[:space:]]*\).*/\1/p" <<<"$2"; }

say "build the fixture"
gcc -O2 -I "$top/test/fixtures" -o "$work/modelserver" "$top/test/fixtures/modelserver.c"
gcc -O2 -I "$top/test/fixtures" -o "$work/launch" "$top/test/fixtures/launch.c"

say "start a $size model server"
cd "$work"
setsid "$work/launch" "$work/modelserver" "$size" 0 </dev/null >"$work/server.log" 2>&1 &
for _ in $(seq 300); do grep -q '^ready' "$work/server.log" && break; sleep 0.1; done
ready=$(grep '^ready' "$work/server.log") || { cat "$work/server.log"; exit 1; }
pid=$(field pid "$ready") port=$(field port "$ready") addr=$(field addr "$ready")
echo "pid $pid on 127.0.0.1:$port, weights at $addr"
before=$(ask "$port" "touch 1")
echo "touch 1 -> $before"
full=$(ask "$port" token)
echo "token   -> $full"

say "dump it"
run "$bin/snapctl" dump -t "$pid" -D "$work/snap"
pid=
run "$bin/snapctl" inspect -D "$work/snap" | sed -n '1,4p;/BLOCKS/,$p'

say "mount the snapshot"
mkdir "$mnt"
run "$bin/lazyfs" --background "$work/snap" "$mnt"
p=$(ls "$mnt" | grep -v json)
run ls -l "$mnt" "$mnt/$p"
run head -n 8 "$mnt/$p/maps"
echo "..."
run xxd -s "$addr" -l 64 "$mnt/$p/mem"

say "restore it lazily through the mount"
t0=$(now)
"$bin/snapctl" restore -D "$work/snap" --lazy --mount "$mnt" --pidfile "$work/pid" >"$work/restore.log" 2>&1 &
restorer=$!
first=
for _ in $(seq 3000); do
	if first=$(ask "$port" "touch 1" 2>/dev/null); then break; fi
	sleep 0.005
done
t1=$(now)
[ -n "$first" ] || { cat "$work/restore.log"; echo "demo: no answer" >&2; exit 1; }
pid=$(cat "$work/pid")
echo "touch 1 -> $first"
again=$(ask "$port" token)
t2=$(now)
echo "token   -> $again"
wait "$restorer"
restorer=
t3=$(now)
cat "$work/restore.log"

[ "$(field checksum "$first")" = "$(field checksum "$before")" ] || { echo "demo: checksum differs after restore" >&2; exit 1; }
[ "$(field checksum "$again")" = "$(field checksum "$full")" ] || { echo "demo: full checksum differs after restore" >&2; exit 1; }

say "result"
printf 'first response (touch 1%% of memory): %5d ms after the restore command\n' "$(ms "$t0" "$t1")"
printf 'whole memory read (token):           %5d ms\n' "$(ms "$t0" "$t2")"
printf 'every page in, snapctl exited:       %5d ms\n' "$(ms "$t0" "$t3")"
echo "checksums match the original server's."
