#!/usr/bin/env python3
"""Dump and restore of memcached with several snapctl builds and CRIU,
outside the harness (memcached.md quotes it).

usage (root, from the module root, after make build bin/launch):
  chrt -r 10 python3 test/bench/notes/ab-memcached.py RUNS NAME=PROGRAM[,...] [KEYS]
  e.g. ... 3 old=/tmp/old/snapctl,new=bin/snapctl,criu=/path/to/criu 200000

memcached (Debian's) with 10 worker threads (-t 10) and a 128 MiB cache (no evictions),
filled with KEYS keys of 256-byte values (200,000 by default: ~57 MiB of
its slabs), then idle with no client connected. Each round, for each
program (NAME; a program named criu is CRIU) in alternating order: start
and fill a memcached, dump it (timed: the command's wall time), restore it
eagerly, time the first GET of a known key from the start of the restore
command and check its value, kill it; then the same with a lazy restore
(snapctl restore --lazy; CRIU: criu lazy-pages --daemon, then criu restore
--lazy-pages, timed from the daemon's start). Page cache warm (the dump
just wrote the files). Prints every run, then medians.
"""
import ctypes, os, signal, socket, statistics, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True); libc.prctl(36, 1, 0, 0, 0)
WT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..'))
runs = int(sys.argv[1])
bins = dict(x.split('=') for x in sys.argv[2].split(','))
keys = int(sys.argv[3]) if len(sys.argv) > 3 else 200000
work = '/tmp/lazyfs-ab-memcached'; os.makedirs(work, exist_ok=True)
port = 22000 + os.getpid() % 5000
def is_criu(b): return os.path.basename(b) == 'criu'
def reap():
    try:
        while True:
            p, _ = os.waitpid(-1, os.WNOHANG)
            if p == 0: break
    except ChildProcessError: pass
def alive(pid):
    try:
        st = open('/proc/%d/stat' % pid).read(); return ' Z ' not in st[st.rfind(')'):]
    except FileNotFoundError: return False
def gone(pid):
    while alive(pid) or os.path.exists('/proc/%d' % pid): reap(); time.sleep(0.002)
def value(i): return (b'%08d' % i) * 32
def connect(deadline=60):
    end = time.time() + deadline
    while True:
        try: return socket.create_connection(('127.0.0.1', port), timeout=deadline)
        except OSError:
            if time.time() > end: raise
            time.sleep(0.002)
def get(s, i):
    s.sendall(b'get key%d\r\n' % i)
    buf = b''
    while not buf.endswith(b'END\r\n'):
        d = s.recv(65536)
        if not d: raise EOFError('memcached closed the connection')
        buf += d
    return buf
def start():
    log = open(f'{work}/memcached.log', 'w')
    p = subprocess.Popen([WT + '/bin/launch', '/usr/bin/memcached', '-U', '0', '-p', str(port), '-l', '127.0.0.1',
                          '-t', '10', '-m', '128', '-u', 'root'], stdout=log, stderr=log, start_new_session=True)
    s = connect()
    for lo in range(0, keys, 1000):
        s.sendall(b''.join(b'set key%d 0 0 256 noreply\r\n%s\r\n' % (i, value(i)) for i in range(lo, min(keys, lo + 1000))))
    assert value(keys - 1) in get(s, keys - 1) and value(12345) in get(s, 12345)
    s.close()
    return p
res = {}
started = []
def cleanup():
    # A failed round must not leave its memcached behind.
    for q in started:
        if alive(q.pid):
            os.kill(q.pid, signal.SIGKILL)
import atexit; atexit.register(cleanup)
for r in range(runs):
    for name, b in (list(bins.items()) if r % 2 == 0 else list(bins.items())[::-1]):
        for mode in ('eager', 'lazy'):
            p = start(); started.append(p)
            d = f'{work}/snap-{name}'; subprocess.run(['rm', '-rf', d]); os.makedirs(d)
            t0 = time.monotonic()
            if is_criu(b):
                subprocess.run([b, 'dump', '-t', str(p.pid), '-D', d, '--shell-job', '--tcp-established', '-o', 'dump.log'], check=True)
            else:
                os.rmdir(d)
                subprocess.run([b, 'dump', '-t', str(p.pid), '-D', d], check=True, capture_output=True)
            dump = time.monotonic() - t0
            p.wait(); gone(p.pid)
            if is_criu(b):
                args = [b, 'restore', '-D', d, '--shell-job', '--tcp-established', '-d', '-o', 'restore.log']
            else:
                args = [b, 'restore', '-D', d]
            t0 = time.monotonic()
            if mode == 'lazy':
                if is_criu(b):
                    subprocess.run([b, 'lazy-pages', '-D', d, '--daemon', '--pidfile', d + '/lazy.pid', '-o', 'lazy-pages.log'], check=True)
                    args.append('--lazy-pages')
                else:
                    args.append('--lazy')
            sp = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            s = connect(); got = get(s, 12345); first = time.monotonic() - t0; s.close()
            assert value(12345) in got, got[:100]
            out = sp.communicate()[0].decode()
            os.kill(p.pid, signal.SIGKILL); gone(p.pid)
            if mode == 'lazy' and is_criu(b):
                pid = int(open(d + '/lazy.pid').read())
                for _ in range(2500):
                    if not alive(pid): break
                    time.sleep(0.002)
                if alive(pid): os.kill(pid, signal.SIGKILL)
            res.setdefault((name, mode), []).append((dump, first))
            print(r, name, mode, 'dump %.3f first GET %.3f' % (dump, first), out.strip().splitlines()[-1][:120] if out.strip() else '', flush=True)
print('medians: dump first-GET')
for k, v in sorted(res.items()):
    print(k, ' '.join('%.3f' % statistics.median(x[i] for x in v) for i in range(2)))
