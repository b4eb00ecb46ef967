// SPDX-License-Identifier: MIT
/*
 * gb-work - the guest preset's workloads (bench/guest/guestbench.sh), static,
 * for the busybox guest. Each traces a known number of operations:
 *
 *   gb-work getppid N            N getppid() calls: two syscall events each
 *   gb-work pingpong N           N round trips of one byte between this process
 *                                and a child over two pipes: every half trip
 *                                wakes the other side and switches to it
 *   gb-work forkexec N PATH      N x (fork, exec PATH nop, wait)
 *   gb-work nop                  exit 0 at once (the exec target)
 *   gb-work mark                 one personality(0xffffffff) call (a query that
 *                                changes nothing): a system call nothing else
 *                                makes, for a consumer's output to be searched
 *   gb-work rate PER_S SECS      getppid() paced at PER_S calls per second for
 *                                SECS seconds, in 1 ms ticks, sleeping out the
 *                                rest of each tick (clock_gettime is the vDSO
 *                                here, no syscall; one clock_nanosleep a tick)
 *
 * Output, one line on stdout:
 *   GBW workload=W ops=N wall_ns=T cpu_ns=C [target_per_s=R achieved_per_s=A]
 * wall_ns: CLOCK_MONOTONIC around the loop; cpu_ns: the CPU time this process
 * and its waited-for children used in it (getrusage; the kernel's precise
 * runtime, split by ticks only between user and system). On a one-vCPU guest
 * wall - cpu is the time other processes (a tracer's consumer) took the CPU.
 * Exit status: 0, 1 a system call failed, 2 usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DIE(...) do { fprintf(stderr, "gb-work: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t tv_ns(struct timeval tv)
{
	return (uint64_t)tv.tv_sec * 1000000000u + (uint64_t)tv.tv_usec * 1000u;
}

/* CPU time of this process and of its children that were waited for. */
static uint64_t cpu_ns(void)
{
	struct rusage self, kids;

	getrusage(RUSAGE_SELF, &self);
	getrusage(RUSAGE_CHILDREN, &kids);
	return tv_ns(self.ru_utime) + tv_ns(self.ru_stime) +
	       tv_ns(kids.ru_utime) + tv_ns(kids.ru_stime);
}

struct span {
	uint64_t wall0, cpu0;
};

static struct span begin(void)
{
	struct span s = { now_ns(), cpu_ns() };

	return s;
}

static void report(const char *w, struct span s, uint64_t ops)
{
	uint64_t wall = now_ns() - s.wall0, cpu = cpu_ns() - s.cpu0;

	printf("GBW workload=%s ops=%" PRIu64 " wall_ns=%" PRIu64 " cpu_ns=%" PRIu64 "\n",
	       w, ops, wall, cpu);
}

static volatile long sink;

static int do_getppid(uint64_t n)
{
	struct span s = begin();

	for (uint64_t i = 0; i < n; i++)
		sink = getppid();
	report("getppid", s, n);
	return 0;
}

static void xfer(int rfd, int wfd, uint64_t n, int first_write)
{
	char b = 'x';

	for (uint64_t i = 0; i < n; i++) {
		if (first_write && write(wfd, &b, 1) != 1)
			DIE("write: %s", strerror(errno));
		if (read(rfd, &b, 1) != 1)
			DIE("read: %s", strerror(errno));
		if (!first_write && write(wfd, &b, 1) != 1)
			DIE("write: %s", strerror(errno));
	}
}

static int do_pingpong(uint64_t n)
{
	int ping[2], pong[2], status;
	struct span s;
	pid_t kid;

	if (pipe(ping) || pipe(pong))
		DIE("pipe: %s", strerror(errno));
	s = begin();
	kid = fork();
	if (kid < 0)
		DIE("fork: %s", strerror(errno));
	if (kid == 0) {
		xfer(ping[0], pong[1], n, 0);
		_exit(0);
	}
	xfer(pong[0], ping[1], n, 1);
	if (waitpid(kid, &status, 0) != kid || !WIFEXITED(status) || WEXITSTATUS(status))
		DIE("the ping-pong child failed");
	report("pingpong", s, n);
	return 0;
}

static int do_forkexec(uint64_t n, const char *path)
{
	struct span s = begin();

	for (uint64_t i = 0; i < n; i++) {
		int status;
		pid_t kid = fork();

		if (kid < 0)
			DIE("fork: %s", strerror(errno));
		if (kid == 0) {
			execl(path, path, "nop", (char *)NULL);
			_exit(127);
		}
		if (waitpid(kid, &status, 0) != kid || !WIFEXITED(status) || WEXITSTATUS(status))
			DIE("%s nop failed (status %d)", path, status);
	}
	report("forkexec", s, n);
	return 0;
}

/*
 * Paced in 1 ms ticks: the calls due by the end of a tick, then sleep to the tick's end
 * (absolute, so lateness does not accumulate); a tick already over is not slept. The
 * guest has idle time whenever the calls take less than the tick, as a real workload
 * would, so a consumer in the guest is not starved by a busy-waiting pacer.
 */
static int do_rate(double per_s, double secs)
{
	uint64_t done = 0, t0, wall, ticks = (uint64_t)(secs * 1000.0);
	struct span s;

	if (per_s <= 0 || secs <= 0)
		return 2;
	s = begin();
	t0 = s.wall0;
	for (uint64_t k = 1; k <= ticks; k++) {
		uint64_t due = (uint64_t)(per_s * (double)k / 1000.0), end = t0 + k * 1000000u;
		struct timespec ts = { (time_t)(end / 1000000000u), (long)(end % 1000000000u) };

		while (done < due) {
			sink = getppid();
			done++;
		}
		if (now_ns() < end)
			clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
	}
	wall = now_ns() - t0;
	printf("GBW workload=rate ops=%" PRIu64 " wall_ns=%" PRIu64 " cpu_ns=%" PRIu64
	       " target_per_s=%.0f achieved_per_s=%.0f\n", done, wall, cpu_ns() - s.cpu0,
	       per_s, (double)done * 1e9 / (double)wall);
	return 0;
}

static int usage(void)
{
	fputs("usage: gb-work getppid N | pingpong N | forkexec N PATH | nop | mark |\n"
	      "       rate PER_S SECS\n", stderr);
	return 2;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage();
	if (!strcmp(argv[1], "nop"))
		return 0;
	if (!strcmp(argv[1], "mark"))
		return personality(0xffffffff) < 0;
	if (!strcmp(argv[1], "getppid") && argc == 3)
		return do_getppid(strtoull(argv[2], NULL, 0));
	if (!strcmp(argv[1], "pingpong") && argc == 3)
		return do_pingpong(strtoull(argv[2], NULL, 0));
	if (!strcmp(argv[1], "forkexec") && argc == 4)
		return do_forkexec(strtoull(argv[2], NULL, 0), argv[3]);
	if (!strcmp(argv[1], "rate") && argc == 4) {
		int rc = do_rate(strtod(argv[2], NULL), strtod(argv[3], NULL));

		return rc == 2 ? usage() : rc;
	}
	return usage();
}
