#!/usr/bin/env python3
"""A/B restores of the PyTorch server (test/fixtures/torchserver.py) with
several snapctl builds, outside the harness (first-token.md quotes it).

usage (root, from the module root, after make build bin/launch):
  chrt -r 10 python3 test/bench/notes/ab-torch.py RUNS NAME=SNAPCTL[,...] MODES TEMPS [LAYERS WIDTH]
  e.g. ... 3 old=/tmp/old/snapctl,new=bin/snapctl,criu=/path/to/criu eager,mount,direct,criu-eager,criu-lazy warm,cold

A NAME whose program is named criu is CRIU: it dumps its own server
(criu dump --shell-job --tcp-established) and restores it in the modes
criu-eager (criu restore -d) and criu-lazy (criu lazy-pages --daemon on the
image directory, then criu restore --lazy-pages -d: a lazy restore on the
same host, timed from the start of the daemon).

Each snapctl (NAME) dumps its own torchserver (a build may not read the
other's format features), with its default options; then RUNS rounds of:
for each temperature (warm: the snapshot's files read first; cold: page
cache dropped), each snapctl (in alternating order), each mode (eager,
lazy through the private mount, lazy --source direct, or mount-ws: lazy
through the mount with a working set recorded once beforehand), restore and
time ping and token from the start of snapctl, and its exit; the token's
answer is checked against the original's. Prints every run, then medians.
Run it under SCHED_RR (chrt -r) on a shared machine (see ab-lazy.py).
"""
import ctypes, os, socket, subprocess, sys, time, statistics, signal
libc = ctypes.CDLL(None, use_errno=True); libc.prctl(36, 1, 0, 0, 0)
WT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..'))
runs = int(sys.argv[1])
bins = dict(x.split('=') for x in sys.argv[2].split(','))
modes = sys.argv[3].split(','); temps = sys.argv[4].split(',')
shape = sys.argv[5:7] if len(sys.argv) > 6 else ['12', '768']
work = '/tmp/lazyfs-ab-torch'; os.makedirs(work, exist_ok=True)
def reap():
    try:
        while True:
            p, _ = os.waitpid(-1, os.WNOHANG)
            if p == 0: break
    except ChildProcessError: pass
def ask(port, reqs, t0, deadline=120):
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
def kill(pid):
    os.kill(pid, signal.SIGKILL)
    while alive(pid): reap(); time.sleep(0.002)
    reap()
port = 21000 + os.getpid() % 5000
snaps = {}
def is_criu(b): return os.path.basename(b) == 'criu'
for name, b in bins.items():
    log = open(f'{work}/ts-{name}.log', 'w')
    p = subprocess.Popen([WT+'/bin/launch', '/usr/bin/python3', '-I', WT+'/test/fixtures/torchserver.py', str(port)] + shape,
                         stdout=log, stderr=log, start_new_session=True)
    while 'ready' not in open(f'{work}/ts-{name}.log').read():
        assert p.poll() is None, open(f'{work}/ts-{name}.log').read()
        time.sleep(0.05)
    want = ask(port, ['token'], time.monotonic())[0][0].split(' us=')[0]
    d = f'{work}/snap-{name}'; subprocess.run(['rm', '-rf', d])
    t0 = time.monotonic()
    if is_criu(b):
        os.makedirs(d)
        subprocess.run([b, 'dump', '-t', str(p.pid), '-D', d, '--shell-job', '--tcp-established', '-o', 'dump.log'], check=True)
        out = 'criu dump'
    else:
        out = subprocess.run([b, 'dump', '-t', str(p.pid), '-D', d], check=True, capture_output=True).stdout.decode()
    print(name, 'dump %.3f' % (time.monotonic() - t0), out.strip().splitlines()[-1], flush=True)
    p.wait(); snaps[name] = (d, p.pid)
    if 'mount-ws' in modes and not is_criu(b):
        ws = d + '-ws'; subprocess.run(['rm', '-rf', ws]); subprocess.run(['cp', '-a', d, ws], check=True)
        while alive(p.pid): reap(); time.sleep(0.002)
        sp = subprocess.Popen([b, 'restore', '-D', ws, '--lazy', '--record-working-set', '--record-for', '60s'],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        ask(port, ['ping', 'token'], time.monotonic())
        sp.send_signal(signal.SIGUSR1)
        print(name, 'working set:', sp.communicate()[0].decode().strip().splitlines()[-1], flush=True)
        kill(p.pid)
res = {}
for r in range(runs):
    for temp in temps:
        for name, b in (list(bins.items()) if r % 2 == 0 else list(bins.items())[::-1]):
            for mode in modes:
                if is_criu(b) != mode.startswith('criu'):
                    continue
                d, pid = snaps[name]
                if mode == 'mount-ws': d += '-ws'
                files = [os.path.join(d, x) for x in os.listdir(d)]
                if temp == 'cold':
                    os.sync(); open('/proc/sys/vm/drop_caches', 'w').write('3\n')
                else:
                    for x in files: subprocess.run(['cat', x], stdout=subprocess.DEVNULL)
                args = [b, 'restore', '-D', d] + {'eager': [], 'mount': ['--lazy'], 'mount-ws': ['--lazy'],
                                                  'direct': ['--lazy', '--source', 'direct'],
                                                  'criu-eager': ['--shell-job', '--tcp-established', '-d', '-o', 'restore.log'],
                                                  'criu-lazy': ['--shell-job', '--tcp-established', '-d', '--lazy-pages', '-o', 'restore.log']}[mode]
                for x in ('lazy-pages.socket', 'lazy.pid'):
                    if os.path.exists(os.path.join(d, x)): os.remove(os.path.join(d, x))
                t0 = time.monotonic()
                if mode == 'criu-lazy':
                    # The daemon serves the pages from the image directory
                    # (same host); the restore finds it by its socket there.
                    subprocess.run([b, 'lazy-pages', '-D', d, '--daemon', '--pidfile', os.path.join(d, 'lazy.pid'), '-o', 'lazy-pages.log'], check=True)
                sp = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                a = ask(port, ['ping', 'token'], t0)
                out = sp.communicate()[0].decode(); wall = time.monotonic() - t0
                got = a[1][0].split(' us=')[0]
                assert got == want, (got, want, out)
                kill(pid)
                key = (name, mode, temp)
                res.setdefault(key, []).append((a[0][1], a[1][1], wall))
                last = out.strip().splitlines()[-1][:150] if out.strip() else ''
                print(r, key, 'ping %.3f token %.3f exit %.3f' % (a[0][1], a[1][1], wall), last, flush=True)
print('medians: ping token exit')
for k, v in sorted(res.items()):
    print(k, ' '.join('%.3f' % statistics.median(x[i] for x in v) for i in range(3)))
