/* SPDX-License-Identifier: MIT */
/*
 * dbguest - the guest side of the doorbell benchmark (static, runs in the
 * busybox guest as root, no driver bound to the ivshmem device). It maps
 * the device's BAR0 (registers) and BAR2 (shared memory) through sysfs
 * and rings the host's doorbell, (HOST_ID << 16) | 0, BAR0 offset 12.
 *
 *   dbguest ring N PHASE        N doorbells back to back: the rate
 *   dbguest rtt N MODE PHASE    N round trips: shm[REQ] = n, ring, spin
 *                               until the host copies n to shm[REPLY]
 *                               (MODE 0: host blocks on its eventfd,
 *                               1: host busy-reads it)
 *
 * Prints one JSON line. Times are CLOCK_MONOTONIC in the guest.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define HOST_ID 1
enum { W_REQ = 0, W_REPLY = 8, W_MODE = 16, W_PHASE = 24 };

static uint64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static char *find_device(void)
{
	static char path[512];
	const char *env = getenv("IVTRACE_IVSHMEM");
	struct dirent *e;
	DIR *d;

	if (env && *env)
		return strncpy(path, env, sizeof(path) - 1);
	d = opendir("/sys/bus/pci/devices");
	while (d && (e = readdir(d))) {
		char f[600], v[32] = "", dv[32] = "";
		FILE *fp;

		snprintf(f, sizeof(f), "/sys/bus/pci/devices/%s/vendor", e->d_name);
		if ((fp = fopen(f, "r"))) {
			if (!fgets(v, sizeof(v), fp))
				v[0] = 0;
			fclose(fp);
		}
		snprintf(f, sizeof(f), "/sys/bus/pci/devices/%s/device", e->d_name);
		if ((fp = fopen(f, "r"))) {
			if (!fgets(dv, sizeof(dv), fp))
				dv[0] = 0;
			fclose(fp);
		}
		if (!strncmp(v, "0x1af4", 6) && !strncmp(dv, "0x1110", 6)) {
			snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s", e->d_name);
			closedir(d);
			return path;
		}
	}
	if (d)
		closedir(d);
	return NULL;
}

static void *map_bar(const char *dev, int bar, size_t len)
{
	char f[600];
	int fd;
	void *p;

	snprintf(f, sizeof(f), "%s/resource%d", dev, bar);
	fd = open(f, O_RDWR | O_SYNC);
	if (fd < 0)
		return NULL;
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	return p == MAP_FAILED ? NULL : p;
}

static int cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	volatile uint32_t *regs;
	volatile uint64_t *shm;
	char *dev = find_device();
	uint64_t n, i, t0, t1;

	if (argc < 4 || !dev) {
		fprintf(stderr, "usage: dbguest ring N PHASE | rtt N MODE PHASE (device %s)\n",
			dev ? dev : "not found");
		return 2;
	}
	regs = map_bar(dev, 0, 256);
	shm = map_bar(dev, 2, 4096);
	if (!regs || !shm) {
		perror("mmap BAR");
		return 1;
	}
	n = strtoull(argv[2], NULL, 0);
	if (!strcmp(argv[1], "ring")) {
		shm[W_PHASE] = strtoull(argv[3], NULL, 0);
		__sync_synchronize();
		t0 = now_ns();
		for (i = 0; i < n; i++)
			regs[3] = (HOST_ID << 16) | 0;	/* BAR0 + 12: Doorbell */
		t1 = now_ns();
		printf("{\"test\": \"ring\", \"doorbells\": %llu, \"seconds\": %.6f, \"per_s\": %.0f}\n",
		       (unsigned long long)n, (t1 - t0) / 1e9, n / ((t1 - t0) / 1e9));
		return 0;
	}
	if (!strcmp(argv[1], "rtt") && argc == 5) {
		uint64_t *lat = calloc(n, sizeof(*lat)), timeouts = 0, done = 0;

		shm[W_MODE] = strtoull(argv[3], NULL, 0);
		shm[W_PHASE] = strtoull(argv[4], NULL, 0);
		for (i = 1; i <= n; i++) {
			uint64_t deadline;

			t0 = now_ns();
			__atomic_store_n(&shm[W_REQ], i, __ATOMIC_RELEASE);
			regs[3] = (HOST_ID << 16) | 0;
			deadline = t0 + 100000000ull;	/* 100 ms */
			while (__atomic_load_n(&shm[W_REPLY], __ATOMIC_ACQUIRE) != i) {
				if (now_ns() > deadline) {
					timeouts++;
					break;
				}
			}
			t1 = now_ns();
			if (__atomic_load_n(&shm[W_REPLY], __ATOMIC_ACQUIRE) == i)
				lat[done++] = t1 - t0;
		}
		qsort(lat, done, sizeof(*lat), cmp);
#define P(q) (done ? lat[(uint64_t)((done - 1) * (q))] / 1000.0 : 0)
		printf("{\"test\": \"rtt\", \"mode\": \"%s\", \"round_trips\": %llu, \"timeouts\": %llu, "
		       "\"us\": {\"min\": %.2f, \"p50\": %.2f, \"p90\": %.2f, \"p99\": %.2f, \"max\": %.2f}}\n",
		       shm[W_MODE] == 1 ? "host busy-reads" : "host blocks",
		       (unsigned long long)done, (unsigned long long)timeouts,
		       P(0.0), P(0.5), P(0.9), P(0.99), P(1.0));
		return 0;
	}
	fprintf(stderr, "unknown test %s\n", argv[1]);
	return 2;
}
