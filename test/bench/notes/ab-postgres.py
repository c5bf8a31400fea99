#!/usr/bin/env python3
"""The PostgreSQL 15 tree dumped and restored by one or more snapctl
builds, its first answer timed as the harness times the model servers'
(postgres.md quotes it).

usage (root, from the module root, after make build), with a cluster
made once as ab-postgres.sh says:
  python3 test/bench/notes/ab-postgres.py ROUNDS NAME=SNAPCTL[,...]
  e.g. ... 5 base=/tmp/base/snapctl,new=bin/snapctl

The cluster in /tmp/pgt (128 MB of shared buffers, default settings) is
started on 127.0.0.1:54329, filled by `pgbench -i -s 10` (159 MB) and
worked by `pgbench -c 2 -T 5`. Each round, for each build in turn and
for each of eager and --lazy: dump the tree (6 processes), time a read
of the snapshot's files (`cat`, page cache warm: the dump just wrote
them), wait 2.5 s (this host's init reaps the dumped processes every
~2 s; a restore would wait for their pids), then start the restore and,
with it, a client already running (this script) that connects every
2 ms until the postmaster accepts, logs in (protocol 3, trust) and sends
`select count(*) from pgbench_branches`. *first answer* is from the
start of the restore command to that answer (checked: 10 rows' count).
The command's own figures are printed too. After each restore, one
second of pgbench must end without a failed transaction.
"""
import os, socket, statistics, struct, subprocess, sys, time

B = '/usr/lib/postgresql/15/bin'
PGT = '/tmp/pgt'
PORT = 54329
rounds = int(sys.argv[1])
bins = dict(x.split('=') for x in sys.argv[2].split(','))


def su(cmd, **kw):
    return subprocess.run(['su', 'postgres', '-s', '/bin/sh', '-c', cmd], stdin=subprocess.DEVNULL, **kw)


def messages(s, buf):
    """Reads messages until ReadyForQuery; returns the DataRow fields seen."""
    rows = []
    while True:
        while len(buf) < 5:
            d = s.recv(65536)
            if not d:
                raise EOFError('postgres closed the connection')
            buf += d
        t, n = buf[0:1], struct.unpack('!I', buf[1:5])[0]
        while len(buf) < 1 + n:
            d = s.recv(65536)
            if not d:
                raise EOFError('postgres closed the connection')
            buf += d
        body, buf = buf[5:1 + n], buf[1 + n:]
        if t == b'E':
            raise RuntimeError('postgres: ' + body.decode(errors='replace'))
        if t == b'D':
            k = struct.unpack('!I', body[2:6])[0]
            rows.append(body[6:6 + k].decode())
        if t == b'Z':
            return rows


def first_answer(t0, proc, deadline=30):
    """Connects every 2 ms until the server accepts, then logs in and
    queries; returns the time of the answer from t0."""
    end = t0 + deadline
    while True:
        try:
            s = socket.create_connection(('127.0.0.1', PORT), timeout=deadline)
            break
        except OSError:
            if time.perf_counter() > end or proc.poll() not in (None, 0):
                raise RuntimeError('no server (restore exited %s)' % proc.poll())
            time.sleep(0.002)
    p = b'user\0postgres\0database\0postgres\0\0'
    s.sendall(struct.pack('!II', 8 + len(p), 196608) + p)
    messages(s, b'')
    q = b'select count(*) from pgbench_branches\0'
    s.sendall(b'Q' + struct.pack('!I', 4 + len(q)) + q)
    rows = messages(s, b'')
    t = time.perf_counter() - t0
    s.sendall(b'X\0\0\0\4')
    s.close()
    if rows != ['10']:
        raise RuntimeError('first query answered %r, want 10' % rows)
    return t


def postmaster():
    return int(open(PGT + '/data/postmaster.pid').readline())


def start_cluster():
    stop = su(f"{B}/pg_ctl -D {PGT}/data -m immediate -t 20 stop", capture_output=True, text=True)
    if stop.returncode != 0 and "Is server running" not in stop.stderr and "No such process" not in stop.stderr:
        raise RuntimeError("pg_ctl stop: " + stop.stdout + stop.stderr)
    time.sleep(1)
    for line in open('/proc/sysvipc/shm').readlines()[1:]:
        f = line.split()
        if f[3] == '56' and f[6] == '0':  # left by a killed cluster: nothing attached
            subprocess.run(['ipcrm', '-m', f[1]])
    su(f'{B}/pg_ctl -D {PGT}/data -l {PGT}/log -o "-p {PORT} -k {PGT} -c listen_addresses=127.0.0.1" -w start',
       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
    su(f'{B}/pgbench -h 127.0.0.1 -p {PORT} -i -s 10 postgres', stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    su(f'{B}/pgbench -h 127.0.0.1 -p {PORT} -c 2 -T 5 postgres', stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def one(snapctl, lazy):
    snap = PGT + '/snap'
    subprocess.run(['rm', '-rf', snap])
    t = time.perf_counter()
    d = subprocess.run([snapctl, 'dump', '-t', str(postmaster()), '-D', snap], capture_output=True, text=True, check=True)
    dump = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run('cat %s/* > /dev/null' % snap, shell=True, check=True)
    read = time.perf_counter() - t
    time.sleep(2.5)
    args = [snapctl, 'restore', '-D', snap] + (['--lazy'] if lazy else [])
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ans = first_answer(t0, proc)
    except Exception:
        proc.kill()
        print(proc.communicate()[1], file=sys.stderr)
        raise
    out, err = proc.communicate(timeout=60)
    exited = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError('restore: exit %d: %s' % (proc.returncode, err))
    said = [l for l in out.splitlines() if l.startswith('restored')][-1]
    bench = su(f'{B}/pgbench -h 127.0.0.1 -p {PORT} -c 2 -T 1 postgres', capture_output=True, text=True)
    failed = [l for l in bench.stdout.splitlines() if 'failed trans' in l]
    if bench.returncode != 0 or not failed or not failed[0].split(':')[1].strip().startswith('0 '):
        raise RuntimeError('pgbench after the restore: %s %s' % (bench.stdout, bench.stderr))
    return dict(dump=dump, read=read, answer=ans, exited=exited, said=said, dumped=d.stdout.strip().splitlines()[-1])


def main():
    start_cluster()
    res = {}
    for r in range(rounds):
        for name, b in bins.items():
            for lazy in (False, True):
                x = one(b, lazy)
                mode = 'lazy' if lazy else 'eager'
                res.setdefault((name, mode), []).append(x)
                print('round %d %s %s: first answer %.0f ms, command %.0f ms, snapshot read %.1f ms | %s | %s' % (
                    r + 1, name, mode, x['answer'] * 1e3, x['exited'] * 1e3, x['read'] * 1e3, x['dumped'], x['said']), flush=True)
    print('medians:')
    for name in bins:
        e, l = res[(name, 'eager')], res[(name, 'lazy')]
        me = statistics.median(x['answer'] for x in e)
        ml = statistics.median(x['answer'] for x in l)
        rd = statistics.median(x['read'] for x in e + l)
        ratios = sorted(x['answer'] / y['answer'] for x, y in zip(l, e))
        print('%s: first answer eager %.0f ms, lazy %.0f ms (lazy/eager %.2f; per round %s); eager command %.0f ms; snapshot read %.1f ms' % (
            name, me * 1e3, ml * 1e3, ml / me, ' '.join('%.2f' % x for x in ratios),
            statistics.median(x['exited'] for x in e) * 1e3, rd * 1e3))
    print(open('/proc/loadavg').read().strip())
    # The last restored tree must shut down as a started one does.
    mode = os.environ.get('PG_STOP', 'fast')
    stop = su(f'{B}/pg_ctl -D {PGT}/data -m {mode} -t 20 stop', capture_output=True, text=True)
    print('pg_ctl stop -m ' + mode + ' after the last restore: exit %d %s' % (stop.returncode, (stop.stdout + stop.stderr).strip()))


main()
