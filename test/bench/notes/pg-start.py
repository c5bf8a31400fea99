#!/usr/bin/env python3
"""PostgreSQL's own start to its first answer: the baseline a restore of
its tree competes with (targets.md quotes it).

usage (root, from the module root, with the cluster of ab-postgres.py in
/tmp/pgt, stopped or running):
  python3 test/bench/notes/pg-start.py ROUNDS

Each round stops the cluster cleanly (pg_ctl -m fast: no recovery at the
next start), reads its files once (page cache warm, as a restore's
snapshot is), then starts the postmaster itself as user postgres (no
pg_ctl, no su) and times, from its exec, the first answer to the query
ab-postgres.py sends, from the same client (connect every 2 ms, protocol
3 login, `select count(*) from pgbench_branches`, checked), retrying
while the server says it is starting up. Stops the cluster at the end.
"""
import os, pwd, subprocess, sys, time, types

HERE = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(HERE, 'ab-postgres.py')).read()
ab = types.ModuleType('ab')
sys.argv, argv = [sys.argv[0], '1', 'x=y'], sys.argv
exec(src[:src.index('def main')], ab.__dict__)  # its client, not its main
rounds = int(argv[1])
pw = pwd.getpwnam('postgres')


def drop():
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)


def stop():
    ab.su(f'{ab.B}/pg_ctl -D {ab.PGT}/data -m fast -t 20 stop', capture_output=True)


took = []
for _ in range(rounds):
    stop()
    time.sleep(1)
    subprocess.run(f'cat {ab.PGT}/data/base/*/* > /dev/null 2>&1', shell=True)
    t0 = time.perf_counter()
    p = subprocess.Popen([f'{ab.B}/postgres', '-D', f'{ab.PGT}/data', '-p', str(ab.PORT), '-k', ab.PGT,
                          '-c', 'listen_addresses=127.0.0.1'], preexec_fn=drop, close_fds=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        try:
            t = ab.first_answer(t0, p)
            break
        except RuntimeError as e:
            if 'starting up' not in str(e):
                raise
            time.sleep(0.002)
    took.append(t * 1e3)
    print('start to first answer %.0f ms' % took[-1], flush=True)
print('median %.0f ms' % sorted(took)[len(took) // 2])
stop()
