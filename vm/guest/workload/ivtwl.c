// SPDX-License-Identifier: MIT
/*
 * ivtwl - the ivtrace guest workload helper (static, for the busybox guest).
 *
 *   ivtwl kids [--ms N] NAME...    fork one child per NAME whose comm is NAME
 *                                  from the fork on; each child alternates
 *                                  ~1 ms of CPU work and a 1 ms sleep for N ms
 *                                  (default 200), so the scheduler switches to
 *                                  it many times, then exits. Prints
 *                                  "IVTWL kid NAME pid=P tid=P" per child,
 *                                  then "IVTWL kids-done N".
 *   ivtwl spin MS                  the same work in this process (use it under
 *                                  a copied or linked file name: exec sets comm
 *                                  to the file name).
 *   ivtwl syscalls N               N getppid() calls; prints ns per call
 *   ivtwl forkexec N PATH [ARG]    N x (fork, exec PATH ARG, wait); prints ns
 *                                  per round trip
 *   ivtwl nop                      exit 0 at once (the exec target of forkexec)
 *   ivtwl cpu N                    N iterations of an integer hash loop (no
 *                                  system call); prints ns per iteration
 *   ivtwl regionstat [PATH]        kernel channels of the region at PATH (default
 *                                  /dev/ivtrace): prints "IVTWL regionstat
 *                                  events_closed=N lost=L channels=C" (events in
 *                                  closed packets and drops, summed)
 *   ivtwl hostwait MAGIC [SECS]    wait (default 120 s) until the last 8 bytes
 *                                  of the ivshmem BAR2 ($IVTRACE_IVSHMEM/
 *                                  resource2) hold MAGIC (hex): a host->guest
 *                                  signal usable while no driver owns the BAR.
 *
 * How the K children get their names: the parent renames itself to NAME
 * (prctl PR_SET_NAME) right before fork(), so sched_process_fork's child_comm
 * already is NAME, then takes its own name back.
 *
 * Exit status: 0 success, 1 a child failed or the wait timed out, 2 usage or
 * system error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static volatile uint64_t sink;

static uint64_t mix(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* About `ms` milliseconds of alternating CPU work and 1 ms sleeps. The work
 * is calibrated once (how many blocks of 1024 hashes take 1 ms) so that the
 * clock is read once per millisecond: without a stable TSC (TCG) the guest's
 * clock_gettime() is a system call, and a clock read per block would make
 * the trace mostly clock_gettime. */
static void spin(long ms)
{
	uint64_t t0 = now_ns(), end = t0 + (uint64_t)ms * 1000000u, x = (uint64_t)getpid();
	uint64_t blocks = 0;
	struct timespec one = { 0, 1000000 };

	do {			/* calibration: the first millisecond */
		for (int i = 0; i < 1024; i++)
			x = mix(x);
		blocks++;
	} while (now_ns() - t0 < 1000000u);
	sink = x;
	nanosleep(&one, NULL);
	while (now_ns() < end) {
		for (uint64_t b = 0; b < blocks; b++)
			for (int i = 0; i < 1024; i++)
				x = mix(x);
		sink = x;
		nanosleep(&one, NULL);
	}
}

static int usage(void)
{
	fputs("usage: ivtwl kids [--ms N] NAME... | spin MS | syscalls N |\n"
	      "       forkexec N PATH [ARG] | cpu N | nop | regionstat [PATH] |\n"
	      "       hostwait MAGIC [SECS]\n", stderr);
	return 2;
}

static int cmd_kids(int argc, char **argv)
{
	long ms = 200;
	int i = 0, n = 0, bad = 0;
	char self[17] = "";

	if (argc >= 2 && !strcmp(argv[0], "--ms")) {
		ms = strtol(argv[1], NULL, 0);
		argc -= 2;
		argv += 2;
	}
	if (argc < 1)
		return usage();
	prctl(PR_GET_NAME, self, 0, 0, 0);
	for (i = 0; i < argc; i++) {
		pid_t p;

		if (prctl(PR_SET_NAME, argv[i], 0, 0, 0)) {
			perror("ivtwl: prctl");
			return 2;
		}
		p = fork();
		if (p == 0) {
			spin(ms);
			_exit(0);
		}
		prctl(PR_SET_NAME, self, 0, 0, 0);
		if (p < 0) {
			perror("ivtwl: fork");
			return 2;
		}
		printf("IVTWL kid %s pid=%d tid=%d\n", argv[i], (int)p, (int)p);
		fflush(stdout);
		n++;
	}
	for (i = 0; i < n; i++) {
		int st;

		if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
			bad++;
	}
	printf("IVTWL kids-done %d%s\n", n, bad ? " (a child failed)" : "");
	return bad ? 1 : 0;
}

static int cmd_syscalls(long n)
{
	uint64_t t0 = now_ns();

	for (long i = 0; i < n; i++)
		syscall(SYS_getppid);
	printf("IVTWL syscalls n=%ld ns_per_op=%.1f\n", n, (double)(now_ns() - t0) / (double)n);
	return 0;
}

static int cmd_forkexec(long n, char **argv)
{
	uint64_t t0 = now_ns();

	for (long i = 0; i < n; i++) {
		int st;
		pid_t p = fork();

		if (p == 0) {
			execv(argv[0], argv);
			_exit(127);
		}
		if (p < 0 || waitpid(p, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr, "ivtwl: %s failed\n", argv[0]);
			return 1;
		}
	}
	printf("IVTWL forkexec n=%ld ns_per_op=%.1f\n", n, (double)(now_ns() - t0) / (double)n);
	return 0;
}

static int cmd_cpu(long n)
{
	uint64_t t0 = now_ns(), x = 1;

	for (long i = 0; i < n; i++)
		x = mix(x);
	sink = x;
	printf("IVTWL cpu n=%ld ns_per_op=%.2f\n", n, (double)(now_ns() - t0) / (double)n);
	return 0;
}

static int cmd_regionstat(const char *path)
{
	uint64_t closed = 0, lost = 0, size, ch_off;
	uint32_t nk, csz;
	const uint8_t *hdr, *m;
	/* O_RDWR even though we only read: MAP_SHARED of a read-only file drops
	 * VM_SHARED, which /dev/ivtrace refuses. */
	int fd = open(path, O_RDWR);

	if (fd < 0) {
		fprintf(stderr, "ivtwl: %s: %s\n", path, strerror(errno));
		return 2;
	}
	hdr = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
	if (hdr == MAP_FAILED)
		goto fail;
	/* struct ivt_region_hdr: size at 16, channels_off at 64, nr_kernel at 96,
	 * channel_size at 100 (abi/include/ivtrace/abi.h) */
	memcpy(&size, hdr + 16, 8);
	memcpy(&ch_off, hdr + 64, 8);
	memcpy(&nk, hdr + 96, 4);
	memcpy(&csz, hdr + 100, 4);
	munmap((void *)hdr, 4096);
	if (size < 4096 || ch_off + (uint64_t)nk * csz > size || csz < 64) {
		fputs("ivtwl: not an ivtrace region\n", stderr);
		return 2;
	}
	m = mmap(NULL, (size_t)(ch_off + (uint64_t)nk * csz), PROT_READ, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		goto fail;
	for (uint32_t c = 0; c < nk; c++) {
		/* struct ivt_channel: lost_full 16, lost_too_big 24, lost_nested 32,
		 * events_closed 56 */
		const volatile uint64_t *w = (const volatile uint64_t *)(m + ch_off + (uint64_t)c * csz);

		closed += w[7];
		lost += w[2] + w[3] + w[4];
	}
	printf("IVTWL regionstat events_closed=%" PRIu64 " lost=%" PRIu64 " channels=%u\n",
	       closed, lost, nk);
	close(fd);
	return 0;
fail:
	fprintf(stderr, "ivtwl: mmap %s: %s\n", path, strerror(errno));
	return 2;
}

static int cmd_hostwait(const char *magic_s, double secs)
{
	const char *dev = getenv("IVTRACE_IVSHMEM");
	char path[512];
	struct stat st;
	uint64_t magic = strtoull(magic_s, NULL, 16), end;
	volatile uint64_t *word;
	void *p;
	int fd;

	if (!dev) {
		fputs("ivtwl: IVTRACE_IVSHMEM is not set (no ivshmem device?)\n", stderr);
		return 2;
	}
	snprintf(path, sizeof(path), "%s/resource2", dev);
	fd = open(path, O_RDWR | O_SYNC);
	if (fd < 0 || fstat(fd, &st) || st.st_size < 8) {
		fprintf(stderr, "ivtwl: %s: %s\n", path, strerror(errno));
		return 2;
	}
	p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		fprintf(stderr, "ivtwl: mmap %s: %s\n", path, strerror(errno));
		return 2;
	}
	word = (volatile uint64_t *)((char *)p + st.st_size - 8);
	end = now_ns() + (uint64_t)(secs * 1e9);
	while (*word != magic) {
		struct timespec ms10 = { 0, 10000000 };

		if (now_ns() > end) {
			fprintf(stderr, "ivtwl: no host signal %#" PRIx64 " in %.0f s\n", magic, secs);
			return 1;
		}
		nanosleep(&ms10, NULL);
	}
	printf("IVTWL hostwait ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage();
	if (!strcmp(argv[1], "kids"))
		return cmd_kids(argc - 2, argv + 2);
	if (!strcmp(argv[1], "spin") && argc == 3) {
		spin(strtol(argv[2], NULL, 0));
		return 0;
	}
	if (!strcmp(argv[1], "syscalls") && argc == 3)
		return cmd_syscalls(strtol(argv[2], NULL, 0));
	if (!strcmp(argv[1], "forkexec") && argc >= 4)
		return cmd_forkexec(strtol(argv[2], NULL, 0), argv + 3);
	if (!strcmp(argv[1], "nop"))
		return 0;
	if (!strcmp(argv[1], "cpu") && argc == 3)
		return cmd_cpu(strtol(argv[2], NULL, 0));
	if (!strcmp(argv[1], "regionstat") && argc <= 3)
		return cmd_regionstat(argc == 3 ? argv[2] : "/dev/ivtrace");
	if (!strcmp(argv[1], "hostwait") && (argc == 3 || argc == 4))
		return cmd_hostwait(argv[2], argc == 4 ? strtod(argv[3], NULL) : 120.0);
	return usage();
}
