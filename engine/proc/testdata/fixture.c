/* fixture: a process holding one of each kind of file descriptor and mapping
 * that engine/proc classifies. Built and started by the package's tests.
 * It prints "ready" and a line of facts, then waits until stdin closes. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/shm.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef PR_SET_VMA
#define PR_SET_VMA 0x53564d41
#define PR_SET_VMA_ANON_NAME 0
#endif

static void die(const char *what) { perror(what); exit(2); }

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "/tmp";
	long pg = sysconf(_SC_PAGESIZE);
	char path[512];

	int efd = eventfd(5, EFD_SEMAPHORE | EFD_NONBLOCK);
	if (efd < 0) die("eventfd");
	int pfd[2];
	if (pipe2(pfd, O_CLOEXEC) < 0) die("pipe");
	if (write(pfd[1], "abc", 3) != 3) die("write pipe");

	int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
	if (tfd < 0) die("timerfd");
	struct itimerspec its = { .it_interval = { 1, 500000000 }, .it_value = { 100, 0 } };
	if (timerfd_settime(tfd, 0, &its, NULL) < 0) die("timerfd_settime");

	sigset_t ss;
	sigemptyset(&ss);
	sigaddset(&ss, SIGUSR1);
	sigaddset(&ss, SIGUSR2);
	int sfd = signalfd(-1, &ss, SFD_CLOEXEC);
	if (sfd < 0) die("signalfd");

	int l4 = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (l4 < 0 || bind(l4, (void *)&a4, sizeof a4) < 0 || listen(l4, 7) < 0) die("tcp4 listen");
	socklen_t al = sizeof a4;
	getsockname(l4, (void *)&a4, &al);
	int c4 = socket(AF_INET, SOCK_STREAM, 0);
	if (c4 < 0 || connect(c4, (void *)&a4, sizeof a4) < 0) die("tcp4 connect");
	int s4 = accept(l4, NULL, NULL);
	if (s4 < 0) die("accept");
	int c4b = socket(AF_INET, SOCK_STREAM, 0); /* left in the accept queue */
	if (c4b < 0 || connect(c4b, (void *)&a4, sizeof a4) < 0) die("tcp4 connect 2");

	int l6 = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
	int have6 = l6 >= 0 && bind(l6, (void *)&a6, sizeof a6) == 0 && listen(l6, 3) == 0;

	int u4 = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in ua = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (u4 < 0 || bind(u4, (void *)&ua, sizeof ua) < 0) die("udp bind");

	int ul = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	snprintf(un.sun_path, sizeof un.sun_path, "%s/fixture.sock", dir);
	unlink(un.sun_path);
	if (ul < 0 || bind(ul, (void *)&un, sizeof un) < 0 || listen(ul, 5) < 0) die("unix listen");
	int uc = socket(AF_UNIX, SOCK_STREAM, 0);
	if (uc < 0 || connect(uc, (void *)&un, sizeof un) < 0) die("unix connect");
	int ua_ = socket(AF_UNIX, SOCK_DGRAM, 0);
	struct sockaddr_un abs = { .sun_family = AF_UNIX };
	int alen = snprintf(abs.sun_path + 1, sizeof abs.sun_path - 1, "lazyfs-fixture-%d", getpid()) + 1;
	if (ua_ < 0 || bind(ua_, (void *)&abs, offsetof(struct sockaddr_un, sun_path) + alen) < 0) die("abstract bind");
	int sp[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sp) < 0) die("socketpair");

	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = { .events = EPOLLIN | EPOLLET, .data.u64 = 0x1122334455667788ULL };
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev) < 0) die("epoll efd");
	ev.events = EPOLLIN | EPOLLOUT; ev.data.fd = pfd[0];
	if (epoll_ctl(ep, EPOLL_CTL_ADD, pfd[0], &ev) < 0) die("epoll pipe");
	ev.events = EPOLLIN; ev.data.fd = l4;
	if (epoll_ctl(ep, EPOLL_CTL_ADD, l4, &ev) < 0) die("epoll sock");

	int in = inotify_init1(IN_CLOEXEC);
	if (in < 0 || inotify_add_watch(in, dir, IN_CREATE | IN_DELETE) < 0) die("inotify");

	int mfd = memfd_create("lazyfs-memfd", MFD_CLOEXEC);
	if (mfd < 0 || ftruncate(mfd, 4 * pg) < 0) die("memfd");
	char *mm = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (mm == MAP_FAILED) die("mmap memfd");
	memset(mm, 'M', pg);

	char *sh = mmap(NULL, 3 * pg, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) die("mmap shared anon");
	sh[0] = 'S';

	/* 8 pages: 0,1 written, 2 read (zero page), 5 written, rest untouched */
	char *an = mmap(NULL, 8 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (an == MAP_FAILED) die("mmap anon");
	an[0] = 1; an[pg] = 2; an[5 * pg] = 5;
	volatile char z = an[2 * pg]; (void)z;
	int named = prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, an, 8 * pg, "lazyfs-anon") == 0; /* needs CONFIG_ANON_VMA_NAME */

	int zfd = open("/dev/zero", O_RDWR);
	char *dz = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_SHARED, zfd, 0);
	if (zfd < 0 || dz == MAP_FAILED) die("mmap /dev/zero");
	dz[0] = 'Z';

	int shmid = shmget(IPC_PRIVATE, 2 * pg, IPC_CREAT | 0600);
	char *sv = shmid < 0 ? NULL : shmat(shmid, NULL, 0);
	if (sv == NULL || sv == (void *)-1) die("shm");
	shmctl(shmid, IPC_RMID, NULL);
	sv[0] = 'V';

	/* private file mapping: 4 pages, page 1 written (copy on write), page 0 read */
	snprintf(path, sizeof path, "%s/fixture.data", dir);
	int ffd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (ffd < 0 || ftruncate(ffd, 4 * pg) < 0) die("data file");
	char *fp = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE, ffd, 0);
	if (fp == MAP_FAILED) die("mmap file private");
	volatile char r = fp[0]; (void)r;
	fp[pg] = 'C';
	lseek(ffd, 1234, SEEK_SET);

	snprintf(path, sizeof path, "%s/fixture.deleted", dir);
	int dfd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (dfd < 0) die("deleted file");
	unlink(path);

	snprintf(path, sizeof path, "%s/fixture.fifo", dir);
	unlink(path);
	if (mkfifo(path, 0600) < 0) die("mkfifo");
	int ffifo = open(path, O_RDWR | O_NONBLOCK);
	if (ffifo < 0) die("open fifo");

	int dirfd = open(dir, O_RDONLY | O_DIRECTORY);
	int nul = open("/dev/null", O_WRONLY | O_APPEND);
	int pidfd = syscall(SYS_pidfd_open, getpid(), 0);
	int uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (dirfd < 0 || nul < 0 || pidfd < 0) die("misc fds");

	printf("ready\n");
	printf("efd=%d pipe=%d,%d tfd=%d sfd=%d tcp4l=%d tcp4c=%d tcp4s=%d tcp4q=%d tcp6l=%d udp4=%d unixl=%d unixc=%d unixabs=%d seqpacket=%d,%d "
	       "epoll=%d inotify=%d memfd=%d dirfd=%d null=%d pidfd=%d uffd=%d deleted=%d fifo=%d file=%d zero=%d "
	       "memfdmap=%p shanon=%p anon=%p devzero=%p sysv=%p fileprivate=%p port=%d named=%d\n",
	       efd, pfd[0], pfd[1], tfd, sfd, l4, c4, s4, c4b, have6 ? l6 : -1, u4, ul, uc, ua_, sp[0], sp[1],
	       ep, in, mfd, dirfd, nul, pidfd, uffd, dfd, ffifo, ffd, zfd,
	       (void *)mm, (void *)sh, (void *)an, (void *)dz, (void *)sv, (void *)fp, ntohs(a4.sin_port), named);
	fflush(stdout);
	char buf[64];
	while (read(0, buf, sizeof buf) > 0)
		;
	unlink(un.sun_path);
	snprintf(path, sizeof path, "%s/fixture.fifo", dir);
	unlink(path);
	return 0;
}
