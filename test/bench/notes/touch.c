/* touch.c: the time to write one byte into every page of N MiB of memory
 * never touched before (default 134, a PostgreSQL tree's): what an eager
 * restore must pay at least to place that much memory on this machine
 * (targets.md quotes it). cc -O2 -o touch touch.c && ./touch [MiB] */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

int main(int argc, char **argv)
{
	size_t n = (size_t)(argc > 1 ? atoi(argv[1]) : 134) << 20;
	for (int i = 0; i < 4; i++) {
		struct timespec a, b;
		char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED) {
			perror("mmap");
			return 1;
		}
		clock_gettime(CLOCK_MONOTONIC, &a);
		for (size_t o = 0; o < n; o += 4096)
			p[o] = 1;
		clock_gettime(CLOCK_MONOTONIC, &b);
		printf("touch %zu MiB: %.1f ms\n", n >> 20, (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6);
		munmap(p, n);
	}
	return 0;
}
