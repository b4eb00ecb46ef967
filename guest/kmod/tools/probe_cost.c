// SPDX-License-Identifier: GPL-2.0
/*
 * probe_cost - what a traced system call costs, from inside the guest.
 *
 * Runs getppid() (a system call that does almost nothing) in a loop and
 * prints the time per call: the minimum and the median of R rounds of N
 * calls. Compare runs without ivtrace.ko, with it loaded and idle
 * (events=none), and with the groups on (events=syscall: two events per
 * call, syscall_entry and syscall_exit).
 *
 *	probe_cost [N [R]]      default N=200000, R=7
 *
 * Built static so it runs in the busybox guest: make -C guest/kmod tools
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 200000;
	int r = argc > 2 ? atoi(argv[2]) : 7, i;
	double per[64], t;
	long k;

	if (n <= 0 || r <= 0 || r > 64) {
		fprintf(stderr, "usage: probe_cost [N [R<=64]]\n");
		return 2;
	}
	for (i = 0; i < r; i++) {
		t = now_ns();
		for (k = 0; k < n; k++)
			syscall(SYS_getppid);
		per[i] = (now_ns() - t) / n;
	}
	qsort(per, r, sizeof(per[0]), cmp);
	printf("probe_cost: getppid %ld x %d: min %.1f ns median %.1f ns\n",
	       n, r, per[0], per[r / 2]);
	return 0;
}
