#!/usr/bin/env python3
"""The PyTorch server's first token after a restore, split into the time
to its first answer (ping) and the forward pass as the server itself
times it (the us= of its token answer), to tell the restore's cost from
the model's (targets.md quotes it).

usage (root, from the module root, after make build):
  python3 test/bench/notes/torch-pass.py PID PORT ROUNDS NAME="COMMAND" ...
  e.g. ... 1845 23456 6 eager="bin/snapctl restore -D /tmp/ts" \\
           mount="bin/snapctl restore -D /tmp/ts --lazy"

PID is the pid the snapshot restores with (its original pid), PORT the
server's port. Each round runs every COMMAND in turn (in reverse order
every other round), from a client already running that connects every
2 ms from the command's start, sends ping then token, checks nothing
but the answer's form, and sends quit; before the next command it waits
until PID is gone (this script is a child subreaper, so it reaps the
server itself) and the port refuses. Prints each run, then medians.
"""
import ctypes, os, socket, statistics, subprocess, sys, time

ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
pid, port, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cmds = [a.split('=', 1) for a in sys.argv[4:]]
res = {n: [] for n, _ in cmds}


def gone():
    while os.path.exists('/proc/%d' % pid):
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.002)
    while True:
        try:
            socket.create_connection(('127.0.0.1', port)).close()
            time.sleep(0.01)
        except OSError:
            return


for r in range(rounds):
    for name, cmd in (cmds if r % 2 == 0 else cmds[::-1]):
        gone()
        time.sleep(0.3)
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, shell=True, stdout=subprocess.DEVNULL)
        while True:
            try:
                s = socket.create_connection(('127.0.0.1', port))
                break
            except OSError:
                if p.poll() not in (None, 0):
                    sys.exit('%s: exit %d' % (name, p.returncode))
                time.sleep(0.002)
        f = s.makefile('rw')
        at = []
        for q in ('ping', 'token'):
            f.write(q + '\n')
            f.flush()
            line = f.readline().split()
            at.append((time.monotonic() - t0) * 1e3)
        if line[0] != 'token' or not line[-1].startswith('us='):
            sys.exit('%s: token answered %r' % (name, line))
        us = int(line[-1][3:]) / 1e3
        f.write('quit\n')
        f.flush()
        f.readline()
        p.wait()
        res[name].append((at[0], at[1], us))
        print('%s ping %.0f token %.0f pass %.0f ms' % (name, at[0], at[1], us), flush=True)
for name, v in res.items():
    print('%s median: ping %.0f token %.0f pass %.0f ms' % ((name,) + tuple(statistics.median(x[i] for x in v) for i in range(3))))
