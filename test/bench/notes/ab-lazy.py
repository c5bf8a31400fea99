#!/usr/bin/env python3
"""A/B restores of the 1 GiB modelserver with several snapctl builds, outside
the harness (see first-token.md, which quotes its output).

usage (root, from the module root, after make build bin/launch):
  gcc -O2 -std=gnu11 -pthread -I test/fixtures -o /tmp/l13/ms test/fixtures/modelserver.c
  chrt -r 10 python3 test/bench/notes/ab-lazy.py SIZE RUNS NAME=SNAPCTL[,...] MODES TEMPS
  e.g. ... 1G 3 old=/tmp/old/snapctl,new=bin/snapctl eager,mount,direct warm,cold

Each snapctl (NAME) dumps its own modelserver (a build may not read the
other's format features); then RUNS rounds of: for each temperature (warm:
the snapshot's files read first; cold: page cache dropped), each snapctl (in
alternating order), each mode (eager, lazy through the private mount, lazy
--source direct), restore and time ping, touch 1 and token from the start
of snapctl, and its exit; the answers are checked against the original's.
Prints every run, then medians. Run it under SCHED_RR (chrt -r) on a shared
machine: every process of the restore then runs before the others' work.
Never SCHED_FIFO: a Go program spinning at FIFO priority can livelock (see
first-token.md). Under SCHED_RR a restore through the mount answers late
(60-230 ms) in about one run in five: threads of one RR priority wait out
each other's 100 ms quantum (layers.md); compare with runs without chrt.
Env BLOCK sets --compress-block (default 256K).
"""
import ctypes, os, socket, subprocess, sys, time, statistics, signal
libc = ctypes.CDLL(None, use_errno=True); libc.prctl(36, 1, 0, 0, 0)
WT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..'))
size, runs = sys.argv[1], int(sys.argv[2])
bins = dict(x.split('=') for x in sys.argv[3].split(','))
modes = sys.argv[4].split(','); temps = sys.argv[5].split(',')
block = os.environ.get('BLOCK', '256K')
work = '/tmp/lazyfs-ab-lazy'; os.makedirs(work, exist_ok=True)
def reap():
    try:
        while True:
            p, _ = os.waitpid(-1, os.WNOHANG)
            if p == 0: break
    except ChildProcessError: pass
def ask(port, reqs, t0, deadline=60):
    end = time.time() + deadline
    while True:
        try: s = socket.create_connection(('127.0.0.1', port), timeout=deadline); break
        except OSError:
            if time.time() > end: raise
            time.sleep(0.002)
    f = s.makefile('rw'); out = []
    for r in reqs:
        f.write(r + '\n'); f.flush(); out.append((f.readline().strip(), time.monotonic() - t0))
    s.close(); return out
def alive(pid):
    try:
        st = open('/proc/%d/stat' % pid).read(); return ' Z ' not in st[st.rfind(')'):]
    except FileNotFoundError: return False
port = 21000 + os.getpid() % 5000
snaps = {}
for name, b in bins.items():
    log = open(f'{work}/ms-{name}.log', 'w')
    p = subprocess.Popen([WT+'/bin/launch', os.environ.get('MS', '/tmp/l13/ms'), size, str(port), '42'], stdout=log, stderr=log, start_new_session=True)
    while 'ready' not in open(f'{work}/ms-{name}.log').read(): time.sleep(0.05)
    want = [w[0].split(' us=')[0] for w in ask(port, ['touch 1', 'token'], time.monotonic())]
    d = f'{work}/snap-{name}'; subprocess.run(['rm', '-rf', d])
    subprocess.run([b, 'dump', '-t', str(p.pid), '-D', d, '--compress-block', block], check=True)
    p.wait(); snaps[name] = (d, p.pid)
res = {}
for r in range(runs):
    for temp in temps:
        for name, b in (list(bins.items()) if r % 2 == 0 else list(bins.items())[::-1]):
            for mode in modes:
                d, pid = snaps[name]
                files = [os.path.join(d, x) for x in os.listdir(d)]
                if temp == 'cold':
                    os.sync(); open('/proc/sys/vm/drop_caches', 'w').write('3\n')
                else:
                    for x in files: subprocess.run(['cat', x], stdout=subprocess.DEVNULL)
                args = [b, 'restore', '-D', d] + {'eager': [], 'mount': ['--lazy'], 'direct': ['--lazy', '--source', 'direct']}[mode]
                t0 = time.monotonic()
                sp = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                a = ask(port, ['ping', 'touch 1', 'token'], t0)
                out = sp.communicate()[0].decode(); wall = time.monotonic() - t0
                got = [x[0].split(' us=')[0] for x in a[1:]]
                assert got == want, (got, want, out)
                os.kill(pid, signal.SIGKILL)
                while alive(pid): reap(); time.sleep(0.002)
                reap()
                key = (name, mode, temp)
                res.setdefault(key, []).append((a[0][1], a[1][1], a[2][1], wall))
                print(r, key, 'ping %.3f touch1 %.3f token %.3f exit %.3f' % (a[0][1], a[1][1], a[2][1], wall), out.strip().splitlines()[-1][:150], flush=True)
print('medians: ping touch1 token exit')
for k, v in sorted(res.items()):
    print(k, ' '.join('%.3f' % statistics.median(x[i] for x in v) for i in range(4)))
