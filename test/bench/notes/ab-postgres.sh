#!/bin/bash
# The PostgreSQL 15 tree dumped and restored (postgres.md quotes its
# output): 3 rounds of dump, eager restore, dump, lazy restore, each
# followed by a first query and a second of pgbench. The first query
# after a lazy restore goes as soon as the tree runs. ab-postgres.py times
# the first answer as the harness times the model servers' (a client
# already running), which is the figure to compare with them.
#
# usage (root, from the module root, after make build), with a cluster
# made once:
#   mkdir -p /tmp/pgt && chown postgres /tmp/pgt
#   su postgres -s /bin/sh -c '/usr/lib/postgresql/15/bin/initdb -D /tmp/pgt/data -A trust -U postgres'
#   bash test/bench/notes/ab-postgres.sh
# SNAPCTL=path and ROUNDS=n change the binary measured and the rounds
# (one round each of two builds, in turn, compares them in one session).
B=/usr/lib/postgresql/15/bin
S=${SNAPCTL:-$PWD/bin/snapctl}
Q(){ su postgres -s /bin/sh -c "$B/psql -h 127.0.0.1 -p 54329 -Atc \"$1\" postgres" </dev/null; }
su postgres -s /bin/sh -c "$B/pg_ctl -D /tmp/pgt/data -m immediate stop" >/dev/null 2>&1
sleep 1
for id in $(awk 'NR>1 && $4==56 && $7==0 {print $2}' /proc/sysvipc/shm); do ipcrm -m $id; done
python3 -c "
import os,subprocess
os.closerange(3,4096)
subprocess.run(['su','postgres','-s','/bin/sh','-c','$B/pg_ctl -D /tmp/pgt/data -l /tmp/pgt/log -o \"-p 54329 -k /tmp/pgt -c listen_addresses=127.0.0.1\" -w start'], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
"
su postgres -s /bin/sh -c "$B/pgbench -h 127.0.0.1 -p 54329 -i -s 10 postgres" </dev/null >/dev/null 2>&1
su postgres -s /bin/sh -c "$B/pgbench -h 127.0.0.1 -p 54329 -c 2 -T 5 postgres" </dev/null 2>&1 | grep tps
Q "select pg_size_pretty(pg_database_size('postgres'))"
for r in $(seq 1 ${ROUNDS:-3}); do
  for mode in eager lazy; do
    M=$(head -1 /tmp/pgt/data/postmaster.pid)
    rm -rf /tmp/pgt/snap
    d=$($S dump -t $M -D /tmp/pgt/snap | tail -1)
    sz=$(du -sk /tmp/pgt/snap | cut -f1)
    sleep 2.5  # the dumped processes reaped by this host's init (every ~2 s)
    # ts: the restore starts; the first query goes as soon as the tree
    # runs (for --lazy, once the pidfile is written, while memory is
    # still being served), and is timed from ts to its answer.
    rm -f /tmp/ab-postgres.pid /tmp/pgt/restore.out
    ts=$(date +%s%N)
    if [ $mode = eager ]; then
      $S restore -D /tmp/pgt/snap > /tmp/pgt/restore.out
    else
      $S restore -D /tmp/pgt/snap --lazy --pidfile /tmp/ab-postgres.pid > /tmp/pgt/restore.out &
      while [ ! -s /tmp/ab-postgres.pid ] && kill -0 $! 2>/dev/null; do sleep 0.001; done
    fi
    t0=$(date +%s%N); Q "select count(*) from pgbench_branches" >/dev/null; t1=$(date +%s%N)
    wait
    rr=$(grep "^restored" /tmp/pgt/restore.out | tail -1)
    echo "round $r $mode | $d | snapshot ${sz} KiB | $rr | first query $(( (t1-t0)/1000000 )) ms, answered $(( (t1-ts)/1000000 )) ms after the restore began"
    su postgres -s /bin/sh -c "$B/pgbench -h 127.0.0.1 -p 54329 -c 2 -T 1 postgres" </dev/null 2>&1 | grep -E "failed trans" 
  done
done
cat /proc/loadavg
