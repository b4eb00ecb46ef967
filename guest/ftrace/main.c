// SPDX-License-Identifier: GPL-2.0
/*
 * ivtrace-ftrace - the ftrace relay: the guest's ftrace ring-buffer pages
 * into ivtrace's shared-memory channels, and the host's ftrace requests
 * into tracefs (docs/ftrace.md).
 *
 *	ivtrace-ftrace [--tracefs DIR] [--device PATH] [--flush-ms N] [--read]
 *
 * Each CPU's ring buffer is mapped where the kernel allows it (6.10+),
 * else read with read(2); --read reads it on every kernel (to compare).
 * ivtrace.ko ftrace=1 starts it when it binds its device (ftrace_relay=),
 * with --from-module: no terminal then, messages go to the kernel log.
 * SIGTERM or SIGINT: the pumps move what ftrace still holds, write their
 * last counters, close their packets, and the relay exits. It also stops
 * when the region is closed (the module unbound).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <ivtrace_ioctl.h>

#include "relay.h"

static int log_fd = 2;
static struct relay relay;

void relay_log(const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	int n;

	n = snprintf(buf, sizeof(buf), RELAY_NAME ": ");
	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(buf) - 2)
		n = (int)sizeof(buf) - 2;
	buf[n++] = '\n';
	if (write(log_fd, buf, (size_t)n) < 0)
		return;
}

uint64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

static void on_signal(int sig)
{
	(void)sig;
	atomic_store(&relay.stop, 1);
}

/* /dev/ivtrace appears (devtmpfs) right after the module registers it. */
static int open_device(const char *path)
{
	int fd, i;

	for (i = 0; i < 100; i++) {
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd >= 0 || errno != ENOENT)
			return fd < 0 ? -errno : fd;
		usleep(50000);
	}
	return -ENOENT;
}

/* The header says what the module formatted; keep a checked private copy
 * of the layout (nothing read back from shared memory is trusted as an
 * offset later). */
static int check_region(struct relay *r, const struct ivt_region_hdr *h)
{
	const struct ivt_layout *l = &h->layout;

	if (ivt_load_acquire(&h->magic) != IVT_MAGIC || h->abi_major != IVT_ABI_MAJOR ||
	    h->abi_minor < 2 || !(h->features & IVT_FEAT_FTRACE))
		return -EPROTO;
	r->layout = *l;
	r->first_chan = r->layout.nr_kernel_channels;
	r->nr_cpus = h->nr_ftrace_channels;
	if (!r->nr_cpus || r->first_chan + r->nr_cpus > r->layout.nr_channels ||
	    r->layout.nr_channels > IVT_CHANNELS_MAX ||
	    r->layout.subbuf_size < 2 * IVT_FTRACE_PAGE_MAX ||
	    r->layout.pool_off + (uint64_t)r->layout.nr_channels *
	    r->layout.nr_subbufs * r->layout.subbuf_size > r->size)
		return -EPROTO;
	if (!r->flush_ms)
		r->flush_ms = h->flush_interval_ms ? h->flush_interval_ms : 100;
	return 0;
}

static int map_region(struct relay *r)
{
	struct ivt_region_hdr *h;

	h = mmap(NULL, IVT_PAGE_SIZE, PROT_READ, MAP_SHARED, r->dev, 0);
	if (h == MAP_FAILED)
		return -errno;
	r->size = h->region_size;
	munmap(h, IVT_PAGE_SIZE);
	if (r->size < IVT_REGION_MIN || (r->size & (r->size - 1)))
		return -EPROTO;
	r->region = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, r->dev, 0);
	if (r->region == MAP_FAILED)
		return -errno;
	return check_region(r, (const struct ivt_region_hdr *)r->region);
}

/* Serves host requests until stop; publishes formats every second. */
static void serve_requests(struct relay *r)
{
	static struct ivtrace_relay_req req;
	static struct ivtrace_relay_ans ans;
	uint64_t last_scan = now_ms();

	while (!atomic_load(&r->stop)) {
		const struct ivt_region_hdr *h = (const void *)r->region;

		if (ivt_read_once(h->state) != IVT_STATE_LIVE)
			break;
		req.timeout_ms = 1000;
		if (!ioctl(r->dev, IVTRACE_IOC_RELAY_WAIT, &req)) {
			memset(&ans, 0, sizeof(ans));
			ans.seq = req.seq;
			ans.status = tracefs_serve(r, req.text, req.len, ans.text,
						   &ans.len, &ans.flags);
			ioctl(r->dev, IVTRACE_IOC_RELAY_DONE, &ans);
		} else if (errno == EPIPE) {
			relay_log("the module no longer knows this relay; exiting");
			break;
		}
		if (now_ms() - last_scan >= 1000) {
			tracefs_publish(r);
			last_scan = now_ms();
		}
	}
}

static int start(struct relay *r, const char *device, const char *root)
{
	uint32_t cpu;
	int err;

	r->dev = open_device(device);
	if (r->dev < 0)
		return relay_log("cannot open %s: %s", device, strerror(-r->dev)), r->dev;
	err = map_region(r);
	if (err)
		return relay_log("%s: not a region with ftrace channels (%s); load ivtrace.ko with ftrace=1",
				 device, strerror(-err)), err;
	if (ioctl(r->dev, IVTRACE_IOC_RELAY_ATTACH))
		return relay_log("cannot own the ftrace channels: %s (another relay?)",
				 strerror(errno)), -errno;
	r->tracefs = tracefs_open(root);
	if (r->tracefs < 0)
		return relay_log("cannot open tracefs at %s: %s", root,
				 strerror(-r->tracefs)), r->tracefs;
	r->pumps = calloc(r->nr_cpus, sizeof(*r->pumps));
	if (!r->pumps)
		return -ENOMEM;
	err = tracefs_ensure_tsc(r);
	if (err)
		return relay_log("cannot set trace_clock to x86-tsc: %s", strerror(-err)), err;
	tracefs_publish(r);
	for (cpu = 0; cpu < r->nr_cpus; cpu++) {
		err = pump_start(r, &r->pumps[cpu], cpu);
		if (err && err != -ENOENT)	/* a possible CPU never brought up */
			relay_log("cpu%u: no pump: %s", cpu, strerror(-err));
	}
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: " RELAY_NAME " [--tracefs DIR] [--device PATH] [--flush-ms N] [--read] [--from-module]\n");
}

/* How the pumps get their pages: mapped, read(2), or some of each. */
static void log_source(const struct relay *r)
{
	uint32_t cpu, mapped = 0, started = 0;
	int why = 0;

	for (cpu = 0; cpu < r->nr_cpus; cpu++) {
		if (!r->pumps[cpu].started)
			continue;
		started++;
		if (r->pumps[cpu].map)
			mapped++;
		else if (r->pumps[cpu].map_err)
			why = r->pumps[cpu].map_err;
	}
	if (r->use_read)
		relay_log("pages by read(2) of trace_pipe_raw (--read)");
	else if (mapped == started)
		relay_log("pages from the mapped ring buffer (TRACE_MMAP_IOCTL_GET_READER)");
	else
		relay_log("pages by read(2) of trace_pipe_raw on %u of %u CPUs (mapping it: %s)",
			  started - mapped, started, strerror(-why));
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "tracefs", required_argument, NULL, 't' },
		{ "device", required_argument, NULL, 'd' },
		{ "flush-ms", required_argument, NULL, 'f' },
		{ "from-module", no_argument, NULL, 'm' },
		{ "read", no_argument, NULL, 'r' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *root = "/sys/kernel/tracing", *device = "/dev/ivtrace";
	struct sigaction sa = { .sa_handler = on_signal };
	uint32_t cpu;
	int c;

	while ((c = getopt_long(argc, argv, "t:d:f:mrh", opts, NULL)) != -1) {
		switch (c) {
		case 't': root = optarg; break;
		case 'd': device = optarg; break;
		case 'f': relay.flush_ms = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'm': log_fd = open("/dev/kmsg", O_WRONLY | O_CLOEXEC); break;
		case 'r': relay.use_read = 1; break;
		default: usage(); return c == 'h' ? 0 : 2;
		}
	}
	if (log_fd < 0)
		log_fd = 2;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (start(&relay, device, root))
		return 1;
	relay_log("relaying %u CPUs into channels %u..%u, flush every %u ms",
		  relay.nr_cpus, relay.first_chan, relay.first_chan + relay.nr_cpus - 1,
		  relay.flush_ms);
	log_source(&relay);
	serve_requests(&relay);
	atomic_store(&relay.stop, 1);
	for (cpu = 0; cpu < relay.nr_cpus; cpu++)
		pump_join(&relay.pumps[cpu]);
	for (cpu = 0; cpu < relay.nr_cpus; cpu++)
		relay_log("cpu%u: %llu pages, %llu passes blocked by a full channel",
			  cpu, (unsigned long long)relay.pumps[cpu].pages,
			  (unsigned long long)relay.pumps[cpu].blocked);
	return 0;
}
