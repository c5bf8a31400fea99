#!/usr/bin/env python3
"""A/B restores of the weightserver with and without MADV_HUGEPAGE, outside
the harness (see huge-pages.md, which quotes its output).

usage (root, from the module root, after make build bin/launch):
  gcc -O2 -std=gnu11 -pthread -I test/fixtures -o /tmp/ws test/fixtures/weightserver.c
  python3 test/bench/notes/ab-restore.py SIZE RUNS NAME=SNAPCTL[,NAME=SNAPCTL...] MODES ADVICES
  e.g. ... 1G 5 old=/tmp/old/snapctl,new=bin/snapctl eager,lazy hugepage,none

It starts one weightserver per advice, dumps it with the default options,
then, RUNS rounds of: for warm (snapshot files read first) and cold (page
cache dropped), each snapctl (NAME), each mode, each advice, restores,
times ping, touch 1 and token from the start of snapctl and its exit,
counts the huge pages collapsed meanwhile (thp_collapse_alloc),
checks the answers against the original's, reads the restored process's
smaps (VMAs with hg, AnonHugePages) and kills it. The order of the
snapctls and of the advices alternates between rounds. NAME after or
collapse sets EXP_HG for a snapctl built with huge-pages-alternatives.patch
(made against 38e84f4).
Prints every run, then medians.
"""
import ctypes, os, socket, subprocess, sys, time, re, statistics, signal
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
WT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..'))
size = sys.argv[1] if len(sys.argv) > 1 else '1G'
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
bins = dict(x.split('=') for x in sys.argv[3].split(',')) if len(sys.argv) > 3 else {'new': WT+'/bin/snapctl'}
modes = sys.argv[4].split(',') if len(sys.argv) > 4 else ['eager']
ADVS = sys.argv[5].split(',') if len(sys.argv) > 5 else ['hugepage', 'none']
work = '/tmp/thpwork'; os.makedirs(work, exist_ok=True)

def reap():
    try:
        while True:
            p, _ = os.waitpid(-1, os.WNOHANG)
            if p == 0: break
    except ChildProcessError: pass

def ask(port, reqs, t0, deadline=60):
    end = time.time() + deadline
    while True:
        try:
            s = socket.create_connection(('127.0.0.1', port), timeout=deadline); break
        except OSError:
            if time.time() > end: raise
            time.sleep(0.002)
    f = s.makefile('rw'); out = []
    for r in reqs:
        f.write(r + '\n'); f.flush(); out.append((f.readline().strip(), time.monotonic() - t0))
    s.close(); return out

def alive(pid):
    try:
        st = open('/proc/%d/stat' % pid).read()
        return ' Z ' not in st[st.rfind(')'):]
    except FileNotFoundError: return False

def collapses():
    # huge pages khugepaged (or MADV_COLLAPSE) allocated to collapse, system-wide
    for line in open('/proc/vmstat'):
        if line.startswith('thp_collapse_alloc '):
            return int(line.split()[1])
    return 0

snaps = {}
for adv in ['hugepage', 'none']:
    port = 20000 + os.getpid() % 5000 + (0 if adv == 'hugepage' else 1)
    log = open(f'{work}/{adv}.log', 'w')
    p = subprocess.Popen([WT+'/bin/launch', '/tmp/ws', size, str(port), '42', adv], stdout=log, stderr=log, start_new_session=True)
    while 'ready' not in open(f'{work}/{adv}.log').read(): time.sleep(0.05)
    want = ask(port, ['touch 1', 'token'], time.monotonic())
    d = f'{work}/snap-{adv}'; subprocess.run(['rm', '-rf', d])
    subprocess.run([WT+'/bin/snapctl', 'dump', '-t', str(p.pid), '-D', d], check=True, capture_output=True)
    p.wait()
    snaps[adv] = (d, p.pid, port, [w[0].split(' us=')[0] for w in want])
    print(adv, open(f'{work}/{adv}.log').read().strip(), flush=True)

res = {}
for r in range(runs):
    for cold in [False, True]:
        for name, b in (list(bins.items()) if r % 2 == 0 else list(bins.items())[::-1]):
            for mode in modes:
                for adv in (ADVS if r % 2 == 0 else ADVS[::-1]):
                    d, pid, port, want = snaps[adv]
                    files = [os.path.join(d, x) for x in os.listdir(d)]
                    if cold:
                        os.sync(); open('/proc/sys/vm/drop_caches', 'w').write('3\n')
                    else:
                        for x in files: subprocess.run(['cat', x], stdout=subprocess.DEVNULL)
                    args = [b, 'restore', '-D', d] + (['--lazy'] if mode == 'lazy' else [])
                    c0 = collapses()
                    t0 = time.monotonic()
                    env = dict(os.environ); env.pop('EXP_HG', None)
                    if name in ('after', 'collapse'): env['EXP_HG'] = name
                    sp = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
                    a = ask(port, ['ping', 'touch 1', 'token'], t0)
                    out = sp.communicate()[0].decode(); wall = time.monotonic() - t0
                    got = [x[0].split(' us=')[0] for x in a[1:]]
                    assert got == want, (got, want, out)
                    smaps = open('/proc/%d/smaps' % pid).read()
                    hg = len(re.findall(r'VmFlags:.* hg', smaps))
                    ahp = sum(int(x) for x in re.findall(r'AnonHugePages:\s+(\d+)', smaps))
                    col = collapses() - c0
                    os.kill(pid, signal.SIGKILL)
                    while alive(pid): reap(); time.sleep(0.002)
                    reap()
                    key = (name, mode, adv, 'cold' if cold else 'warm')
                    res.setdefault(key, []).append((a[0][1], a[1][1], a[2][1], wall))
                    print(r, key, 'ping %.3f touch1 %.3f token %.3f exit %.3f hg=%d AnonHuge=%dkB collapses=%d' % (a[0][1], a[1][1], a[2][1], wall, hg, ahp, col), flush=True)
print('medians: ping touch1 token exit')
for k, v in sorted(res.items()):
    print(k, ' '.join('%.3f' % statistics.median(x[i] for x in v) for i in range(4)))
