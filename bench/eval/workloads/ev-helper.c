// SPDX-License-Identifier: MIT
/*
 * ev-helper - small guest-side helpers for bench/eval/guest/evalguest.sh
 * (reads the ivtrace region through /dev/ivtrace; struct layouts from
 * abi/include/ivtrace/abi.h):
 *
 *   ev-helper regionstat [PATH]
 *       EVH regionstat events_closed=N lost=L channels=C heartbeat=H
 *       (kernel channels: events in closed packets and drops, summed)
 *   ev-helper hbwait [SECS] [PATH]
 *       wait (default 60 s) until the host's heartbeat word has advanced
 *       twice, i.e. `ivtrace record` is attached and draining; exit 1 on
 *       timeout.
 */
#include "evwl.h"
#include <fcntl.h>
#include <stddef.h>
#include <sys/mman.h>
#include <ivtrace/abi.h>

static const volatile uint8_t *map(const char *path, size_t *len)
{
	struct ivt_region_hdr h;
	const void *p;
	size_t need;
	/* O_RDWR: /dev/ivtrace refuses a mapping without VM_SHARED. */
	int fd = open(path, O_RDWR);

	if (fd < 0)
		EVWL_DIE("ev-helper: %s: %s", path, strerror(errno));
	p = mmap(NULL, sizeof(h), PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		EVWL_DIE("ev-helper: mmap %s: %s", path, strerror(errno));
	memcpy(&h, p, sizeof(h));
	munmap((void *)p, sizeof(h));
	if (h.magic != IVT_MAGIC || h.layout.channel_size < sizeof(struct ivt_channel) ||
	    h.layout.nr_kernel_channels > h.layout.nr_channels ||
	    h.layout.channels_off + (uint64_t)h.layout.nr_kernel_channels *
	    h.layout.channel_size > h.region_size)
		EVWL_DIE("ev-helper: %s is not a formatted ivtrace region", path);
	need = h.layout.channels_off + (size_t)h.layout.nr_kernel_channels * h.layout.channel_size;
	p = mmap(NULL, need, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		EVWL_DIE("ev-helper: mmap %s: %s", path, strerror(errno));
	close(fd);
	*len = need;
	return p;
}

static uint64_t heartbeat(const volatile uint8_t *m)
{
	return *(const volatile uint64_t *)(m + offsetof(struct ivt_region_hdr, host_heartbeat));
}

static int regionstat(const char *path)
{
	size_t len;
	const volatile uint8_t *m = map(path, &len);
	const struct ivt_region_hdr *h = (const void *)m;
	uint64_t closed = 0, lost = 0;

	for (uint32_t c = 0; c < h->layout.nr_kernel_channels; c++) {
		const volatile struct ivt_channel *ch = (const volatile void *)
			(m + h->layout.channels_off + (uint64_t)c * h->layout.channel_size);

		closed += ch->events_closed;
		lost += ch->lost_full + ch->lost_too_big + ch->lost_nested;
	}
	printf("EVH regionstat events_closed=%" PRIu64 " lost=%" PRIu64 " channels=%u heartbeat=%"
	       PRIu64 "\n", closed, lost, h->layout.nr_kernel_channels, heartbeat(m));
	return 0;
}

static int hbwait(double secs, const char *path)
{
	size_t len;
	const volatile uint8_t *m = map(path, &len);
	uint64_t first = heartbeat(m), seen = first;
	int moves = 0;
	double end = evwl_now() + secs;

	while (moves < 2) {
		struct timespec ms5 = { 0, 5000000 };
		uint64_t v = heartbeat(m);

		if (v != seen) {
			seen = v;
			moves++;
			continue;
		}
		if (evwl_now() > end) {
			fprintf(stderr, "ev-helper: host heartbeat did not move in %.0f s (%" PRIu64
				")\n", secs, v);
			return 1;
		}
		nanosleep(&ms5, NULL);
	}
	printf("EVH hbwait ok heartbeat=%" PRIu64 "\n", seen);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "regionstat") && argc <= 3)
		return regionstat(argc == 3 ? argv[2] : "/dev/ivtrace");
	if (argc >= 2 && !strcmp(argv[1], "hbwait") && argc <= 4)
		return hbwait(argc >= 3 ? strtod(argv[2], NULL) : 60.0,
			      argc == 4 ? argv[3] : "/dev/ivtrace");
	fputs("usage: ev-helper regionstat [PATH] | hbwait [SECS] [PATH]\n", stderr);
	return 2;
}
