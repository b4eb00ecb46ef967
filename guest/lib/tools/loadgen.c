/* SPDX-License-Identifier: MIT */
/*
 * ivtrace-loadgen - write a known event stream into an ivtrace region.
 *
 * Each thread t (0-based) writes events seq = 0..N-1 of the type
 * `loadgen:payload` { thread u16, seq u64, data }, byte-packed: u16 t,
 * u64 seq, then data of L bytes, where
 *
 *	L = B                                                   (--size B)
 *	L = MIN + splitmix64(((uint64_t)t << 40) ^ seq) % (MAX - MIN + 1)
 *	                                                  (--size MIN-MAX)
 *
 * and byte i of the data is, with --payload
 *
 *	binary: (uint8_t)(seq * 131 + t * 7 + i)   data is IVT_FT_BYTES:
 *	                                            u32 L, then the L bytes
 *	text:   0x21 + (seq * 131 + t * 7 + i) % 94  data is IVT_FT_STRING:
 *	        (printable ASCII, the default)      the L bytes, then a NUL
 *
 * splitmix64 is the standard one (below). Readers and tests recompute
 * every byte from (t, seq) alone (tests/loadgen_pattern.py,
 * guest/lib/tests/loadgen.c). Keep this comment, splitmix64(), fill_*()
 * and the --help text in agreement.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include <linux/magic.h>
#include <ivtrace.h>

#define PROG			"ivtrace-loadgen"
#define EXIT_USAGE		1
#define EXIT_RUNTIME		2
#define MAX_THREADS		4096u
#define MAX_DATA		(16u << 20)
#define ID_BYTES		10u	/* u16 thread + u64 seq */

static const char usage_text[] =
"usage: " PROG " --shm PATH | --ivshmem-socket PATH [--events N] [--size BYTES|MIN-MAX] [--threads T]\n"
"       [--payload text|binary] [--mode discard|overwrite]\n"
"       [--rate EVENTS_PER_SEC_PER_THREAD] [--channels C] [--subbufs K]\n"
"       [--subbuf-size B] [--create] [--no-close] [--json]\n";

static const char help_text[] =
"\n"
"Write a known stream of events into an ivtrace region, to test and measure\n"
"the whole path: libivtrace's writer, the region, and whatever reads it (the\n"
"host's `ivtrace record`, or the Python tests). Every byte written can be\n"
"recomputed from (thread, seq), so a reader can check each event exactly.\n"
"\n"
"Region:\n"
"  --shm PATH          region file (/dev/shm/NAME on a host, /dev/ivtrace in a\n"
"                      guest). A valid region is attached to as it is; a missing\n"
"                      file, or one that is not a valid region, is formatted with\n"
"                      the geometry below (a non-empty file that is not a region\n"
"                      and not on tmpfs is refused unless --create is given).\n"
"  --ivshmem-socket PATH\n"
"                      act as a guest of an ivshmem server (`ivtrace serve`):\n"
"                      connect to PATH as QEMU does, take the region's descriptor\n"
"                      and the doorbell eventfds the server sends, format the\n"
"                      region (as --create, at the region's fixed size: the\n"
"                      sub-buffers per channel are chosen to fit it) and write\n"
"                      into it; the connection\n"
"                      stays open until the end (the server sees a guest exit)\n"
"  --create            always format the region anew, even if it is valid\n"
"  --channels C        user channels (threads writing at once)      [default 64]\n"
"  --subbufs K         sub-buffers per channel, a power of two      [default 8]\n"
"  --subbuf-size B     bytes per sub-buffer, a power of two >= 4096 [default 256K]\n"
"  --mode M            discard: a full ring drops the newest events (default)\n"
"                      overwrite: a full ring reuses the oldest packet\n"
"                      (geometry and mode apply only when formatting)\n"
"  --no-close          leave the region LIVE at the end; otherwise a region this\n"
"                      run formatted is marked CLOSED (an attached one never is)\n"
"\n"
"Load:\n"
"  --threads T         writer threads, each with its own channel   [default 1]\n"
"  --events N          events per thread                          [default 1000000]\n"
"  --size B | MIN-MAX  data bytes per event                         [default 32]\n"
"  --payload KIND      text (default): data is a NUL-terminated string\n"
"                      binary: data is a u32 length and that many bytes\n"
"  --rate R            events per second per thread, paced in 1 ms batches\n"
"                      [default 0: as fast as possible]\n"
"  --json              print one JSON object with the results on stdout\n"
"\n"
"Payload: event `loadgen:payload` with fields { thread u16, seq u64, data },\n"
"byte-packed little-endian: u16 t, u64 seq, then the data. Thread t (0-based)\n"
"writes seq = 0..N-1 with L data bytes, byte i of which is\n"
"    text:   0x21 + (seq * 131 + t * 7 + i) % 94    (then a NUL; data is a string)\n"
"    binary: (uint8_t)(seq * 131 + t * 7 + i)       (after a u32 L; data is bytes)\n"
"    L = B                                                     (--size B)\n"
"    L = MIN + splitmix64(((uint64_t)t << 40) ^ seq) % (MAX - MIN + 1)\n"
"                                                              (--size MIN-MAX)\n"
"    splitmix64(z): z += 0x9e3779b97f4a7c15;\n"
"                   z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9;\n"
"                   z = (z ^ z >> 27) * 0x94d049bb133111eb;\n"
"                   return z ^ z >> 31;          (all arithmetic mod 2^64)\n"
"\n"
"Output: a summary on stderr, per thread and in total: events attempted,\n"
"written, dropped, ns/event (write-loop time / attempted) and MB/s (payload\n"
"bytes written / write-loop time, 1 MB = 10^6 bytes), then the region's drop\n"
"counters by reason. With --json the same numbers go to stdout as one JSON\n"
"object (totals also at its top level: attempted, written, dropped).\n"
"\n"
"Examples:\n"
"  " PROG " --shm /dev/shm/ivt-demo --events 1000000 --size 32 --threads 2\n"
"  " PROG " --shm /dev/shm/ivt-demo --create --mode overwrite --subbufs 4 \\\n"
"        --events 100000 --size 16-512 --payload binary --json\n"
"  " PROG " --shm /dev/shm/ivt-demo --rate 100000 --events 500000 --no-close\n"
"\n"
"Exit status: 0 success (dropped events are reported, not errors); 1 usage\n"
"error; 2 runtime error (the region could not be created, attached or\n"
"written).\n";

struct opts {
	const char *shm;
	uint64_t events;
	uint32_t size_min, size_max;
	uint32_t threads;
	uint64_t rate;
	struct ivt_region_opts region;
	int geometry_given;
	int create, no_close, json, binary;
	const char *ivshmem_socket;
	char shm_fd_path[64];
};

struct worker {
	pthread_t thread;
	uint32_t t;
	const struct opts *o;
	const struct ivt_event *ev;
	struct ivt_region *region;
	const uint8_t *ramp;
	uint64_t attempted, written, dropped, bytes, elapsed_ns;
};

/* ---- the payload: keep in agreement with the file comment and --help -- */

static uint64_t splitmix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ z >> 27) * 0x94d049bb133111ebull;
	return z ^ z >> 31;
}

static uint32_t data_len(const struct opts *o, uint32_t t, uint64_t seq)
{
	uint64_t span = (uint64_t)o->size_max - o->size_min + 1;

	if (span == 1)
		return o->size_min;
	return o->size_min + (uint32_t)(splitmix64(((uint64_t)t << 40) ^ seq) % span);
}

/*
 * Byte i of the data is ramp[start + i]: a window of a precomputed ramp
 * (binary: k mod 256; text: 0x21 + k mod 94), so filling costs a memcpy.
 */
static uint32_t ramp_period(const struct opts *o)
{
	return o->binary ? 256 : 94;
}

static const uint8_t *data_of(const struct opts *o, const uint8_t *ramp,
			      uint32_t t, uint64_t seq)
{
	return ramp + (seq * 131 + (uint64_t)t * 7) % ramp_period(o);
}

static uint8_t *make_ramp(const struct opts *o)
{
	size_t n = ramp_period(o) + (size_t)o->size_max, i;
	uint8_t *ramp = malloc(n);

	for (i = 0; ramp && i < n; i++)
		ramp[i] = o->binary ? (uint8_t)i : (uint8_t)(0x21 + i % 94);
	return ramp;
}

/* Payload bytes of an event with L data bytes. */
static uint32_t payload_size(const struct opts *o, uint32_t len)
{
	return ID_BYTES + (o->binary ? 4 + len : len + 1);
}

/* ---- small helpers ----------------------------------------------------- */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t deadline)
{
	struct timespec ts = {
		.tv_sec = (time_t)(deadline / 1000000000ull),
		.tv_nsec = (long)(deadline % 1000000000ull),
	};

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static void die_usage(const char *fmt, const char *arg)
{
	fprintf(stderr, PROG ": ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n%s" "Try '" PROG " --help' for more information.\n",
		usage_text);
	exit(EXIT_USAGE);
}

/* A decimal count, optionally with a K/M/G (x1024) suffix for sizes. */
static uint64_t parse_num(const char *opt, const char *s, int suffix,
			  uint64_t lo, uint64_t hi)
{
	char *end;
	uint64_t v, mul = 1;

	errno = 0;
	if (!s || !*s || *s == '-' || *s == '+')
		die_usage("%s needs a non-negative number", opt);
	v = strtoull(s, &end, 10);
	if (suffix && *end && !end[1]) {
		switch (*end) {
		case 'k': case 'K': mul = 1ull << 10; end++; break;
		case 'm': case 'M': mul = 1ull << 20; end++; break;
		case 'g': case 'G': mul = 1ull << 30; end++; break;
		}
	}
	if (errno || *end || end == s || v > hi / mul || v * mul < lo ||
	    v * mul > hi) {
		fprintf(stderr, PROG ": %s %s: expected a number in %" PRIu64
			"..%" PRIu64 "\n", opt, s, lo, hi);
		exit(EXIT_USAGE);
	}
	return v * mul;
}

static void parse_size(struct opts *o, const char *s)
{
	const char *dash = strchr(s, '-');
	char lo[32];

	if (!dash) {
		o->size_min = o->size_max =
			(uint32_t)parse_num("--size", s, 1, 0, MAX_DATA);
		return;
	}
	if ((size_t)(dash - s) >= sizeof(lo))
		die_usage("--size %s: expected BYTES or MIN-MAX", s);
	memcpy(lo, s, (size_t)(dash - s));
	lo[dash - s] = 0;
	o->size_min = (uint32_t)parse_num("--size", lo, 1, 0, MAX_DATA);
	o->size_max = (uint32_t)parse_num("--size", dash + 1, 1, 0, MAX_DATA);
	if (o->size_min > o->size_max)
		die_usage("--size %s: MIN is larger than MAX", s);
}

static const char *mode_name(uint32_t mode)
{
	return mode == IVT_MODE_OVERWRITE ? "overwrite" : "discard";
}

enum {
	OPT_SHM = 256, OPT_EVENTS, OPT_SIZE, OPT_THREADS, OPT_MODE, OPT_RATE,
	OPT_CHANNELS, OPT_SUBBUFS, OPT_SUBBUF_SIZE, OPT_CREATE, OPT_NO_CLOSE,
	OPT_JSON, OPT_PAYLOAD, OPT_IVSHMEM,
};

static const struct option long_opts[] = {
	{ "shm", required_argument, 0, OPT_SHM },
	{ "events", required_argument, 0, OPT_EVENTS },
	{ "size", required_argument, 0, OPT_SIZE },
	{ "threads", required_argument, 0, OPT_THREADS },
	{ "mode", required_argument, 0, OPT_MODE },
	{ "rate", required_argument, 0, OPT_RATE },
	{ "channels", required_argument, 0, OPT_CHANNELS },
	{ "subbufs", required_argument, 0, OPT_SUBBUFS },
	{ "subbuf-size", required_argument, 0, OPT_SUBBUF_SIZE },
	{ "create", no_argument, 0, OPT_CREATE },
	{ "no-close", no_argument, 0, OPT_NO_CLOSE },
	{ "json", no_argument, 0, OPT_JSON },
	{ "payload", required_argument, 0, OPT_PAYLOAD },
	{ "ivshmem-socket", required_argument, 0, OPT_IVSHMEM },
	{ "help", no_argument, 0, 'h' },
	{ 0, 0, 0, 0 },
};

static void parse_opt(struct opts *o, int c, const char *arg)
{
	switch (c) {
	case OPT_SHM: o->shm = arg; break;
	case OPT_IVSHMEM: o->ivshmem_socket = arg; break;
	case OPT_EVENTS: o->events = parse_num("--events", arg, 0, 0, UINT64_MAX >> 1); break;
	case OPT_SIZE: parse_size(o, arg); break;
	case OPT_THREADS: o->threads = (uint32_t)parse_num("--threads", arg, 0, 1, MAX_THREADS); break;
	case OPT_RATE: o->rate = parse_num("--rate", arg, 0, 0, 1000000000ull); break;
	case OPT_MODE:
		if (!strcmp(arg, "discard"))
			o->region.mode = IVT_MODE_DISCARD;
		else if (!strcmp(arg, "overwrite"))
			o->region.mode = IVT_MODE_OVERWRITE;
		else
			die_usage("--mode %s: expected discard or overwrite", arg);
		o->geometry_given = 1;
		break;
	case OPT_CHANNELS:
		o->region.channels = (uint32_t)parse_num("--channels", arg, 0, 1, IVT_CHANNELS_MAX);
		o->geometry_given = 1;
		break;
	case OPT_SUBBUFS:
		o->region.subbufs = (uint32_t)parse_num("--subbufs", arg, 0, IVT_SUBBUFS_MIN, IVT_SUBBUFS_MAX);
		o->geometry_given = 1;
		break;
	case OPT_SUBBUF_SIZE:
		o->region.subbuf_size = (uint32_t)parse_num("--subbuf-size", arg, 1, IVT_SUBBUF_MIN, IVT_SUBBUF_MAX);
		o->geometry_given = 1;
		break;
	case OPT_CREATE: o->create = 1; break;
	case OPT_NO_CLOSE: o->no_close = 1; break;
	case OPT_JSON: o->json = 1; break;
	case OPT_PAYLOAD:
		if (strcmp(arg, "text") && strcmp(arg, "binary"))
			die_usage("--payload %s: expected text or binary", arg);
		o->binary = !strcmp(arg, "binary");
		break;
	case 'h':
		printf("%s%s", usage_text, help_text);
		exit(0);
	default:
		die_usage("%s", "unknown option");
	}
}

static void parse_args(struct opts *o, int argc, char **argv)
{
	int c;

	memset(o, 0, sizeof(*o));
	o->events = 1000000;
	o->size_min = o->size_max = 32;
	o->threads = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
		if (c == '?')
			die_usage("unknown or incomplete option '%s'", argv[optind - 1]);
		parse_opt(o, c, optarg);
	}
	if (optind < argc)
		die_usage("unexpected argument '%s'", argv[optind]);
	if (!o->shm == !o->ivshmem_socket)
		die_usage("%s", "one of --shm PATH and --ivshmem-socket PATH is required");
	if ((o->region.subbufs & (o->region.subbufs - 1)) ||
	    (o->region.subbuf_size & (o->region.subbuf_size - 1)))
		die_usage("%s", "--subbufs and --subbuf-size must be powers of two");
}

/* ---- the region ------------------------------------------------------- */

static void runtime_error(const char *what, const char *path, int err,
			  const char *hint)
{
	fprintf(stderr, PROG ": %s %s: %s\n", what, path, strerror(-err));
	if (hint)
		fprintf(stderr, "  hint: %s\n", hint);
	exit(EXIT_RUNTIME);
}

/*
 * One message of the ivshmem server protocol: a little-endian int64 and at
 * most one descriptor (SCM_RIGHTS). Returns 0, or -errno (-EPIPE: closed).
 */
static int ivshmem_recv(int sock, int64_t *val, int *fd)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = val, .iov_len = sizeof(*val) };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
			    .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *c;
	ssize_t n;

	*fd = -1;
	n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
	if (n < 0)
		return -errno;
	if (n != (ssize_t)sizeof(*val))
		return -EPIPE;
	for (c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			memcpy(fd, CMSG_DATA(c), sizeof(int));
	return 0;
}

/*
 * Be a guest of an ivshmem server, as QEMU's ivshmem-doorbell is: connect,
 * read the protocol version (0), our peer id, then -1 with the region's
 * descriptor. The server then sends each peer's eventfds (the host's: the
 * doorbells we could ring; ours: our interrupt vectors); they are taken
 * as they come and kept open, since the region is all a writer needs
 * (libivtrace's writer polls nothing and rings nothing: the host polls).
 * The socket stays open for the life of the process: the server sees the
 * "guest" exit when it closes.
 */
static void ivshmem_connect(struct opts *o)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int64_t version, id, minus1;
	int sock, fd, shm = -1, err;

	if (strlen(o->ivshmem_socket) >= sizeof(a.sun_path))
		die_usage("--ivshmem-socket %s: path too long", o->ivshmem_socket);
	strcpy(a.sun_path, o->ivshmem_socket);
	sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (sock < 0 || connect(sock, (struct sockaddr *)&a, sizeof(a)))
		runtime_error("cannot connect to", o->ivshmem_socket, -errno,
			      "is `ivtrace serve --socket PATH` running?");
	err = ivshmem_recv(sock, &version, &fd);
	if (!err && version != 0)
		err = -EPROTO;
	if (!err)
		err = ivshmem_recv(sock, &id, &fd);
	if (!err)
		err = ivshmem_recv(sock, &minus1, &shm);
	if (!err && (minus1 != -1 || shm < 0))
		err = -EPROTO;
	if (err)
		runtime_error("ivshmem handshake failed with", o->ivshmem_socket, err,
			      "the server must send version 0, our id, then -1 with the region");
	snprintf(o->shm_fd_path, sizeof(o->shm_fd_path), "/proc/self/fd/%d", shm);
	o->shm = o->shm_fd_path;
	o->create = 1;
	fprintf(stderr, PROG ": ivshmem peer %lld of %s, region fd %d\n",
		(long long)id, o->ivshmem_socket, shm);
}

/*
 * A guest module formats its region long after QEMU connected, and the
 * server notices within its format poll; a simulated guest is faster than
 * that. Wait (up to 10 s) until the host's heartbeat moves, as a guest's
 * events would wait in the rings anyway, so that a short run is not over
 * before the server started recording it.
 */
static void wait_for_host(struct ivt_region *r)
{
	const volatile uint64_t *hb;
	struct ivt_region_info ri;
	uint64_t t0 = now_ns();

	ivt_region_info(r, &ri);
	hb = (const volatile uint64_t *)((const char *)ri.base +
		offsetof(struct ivt_region_hdr, host_heartbeat));
	/* Relaxed is enough: only a change is looked for, nothing read after it. */
	while (__atomic_load_n(hb, __ATOMIC_RELAXED) == 0) {
		if (now_ns() - t0 > 10000000000ull) {
			fprintf(stderr, PROG ": the host never started draining (10 s): writing anyway\n");
			return;
		}
		usleep(1000);
	}
}

/*
 * May a file that is not a valid region be formatted over? Yes if it is
 * missing, empty, ours (a region magic, or a zeroed start), or on tmpfs
 * (where regions live); a non-empty foreign file elsewhere is refused.
 */
static int may_overwrite(const char *path)
{
	uint64_t magic = 0;
	struct statfs sfs;
	struct stat st;
	FILE *f;

	if (stat(path, &st) || st.st_size == 0)
		return 1;
	if (!S_ISREG(st.st_mode))
		return 0;
	if (!statfs(path, &sfs) && sfs.f_type == TMPFS_MAGIC)
		return 1;
	f = fopen(path, "rb");
	if (f) {
		if (fread(&magic, sizeof(magic), 1, f) != 1)
			magic = 1;
		fclose(f);
	}
	return magic == 0 || magic == IVT_MAGIC;
}

/*
 * An ivshmem server's region cannot change size (ivtrace serve seals its
 * memfd against shrinking and growing, as a guest's BAR is fixed): format
 * it with the most sub-buffers per channel (--subbufs is ignored; the
 * channels and sub-buffer size are kept) whose planned size is the
 * region's own. Each try that plans a bigger region fails (EPERM, nothing
 * mapped), so the sizes are tried from the largest down.
 */
static int create_fitting(const struct opts *o, struct ivt_region **r)
{
	struct ivt_region_opts ro = o->region;
	uint32_t k;
	int err = -EINVAL;

	for (k = IVT_SUBBUFS_MAX; k >= IVT_SUBBUFS_MIN; k /= 2) {
		ro.subbufs = k;
		err = ivt_region_create(o->shm, &ro, r);
		if (err != -EPERM && err != -EINVAL)
			return err;
	}
	return err;
}

static struct ivt_region *open_region(const struct opts *o)
{
	struct ivt_region *r;
	int err = -ENOENT;

	if (!o->create) {
		err = ivt_region_attach(o->shm, &r);
		if (!err) {
			if (o->geometry_given)
				fprintf(stderr, PROG ": note: %s is an existing region; "
					"--channels/--subbufs/--subbuf-size/--mode are ignored "
					"(use --create to format it anew)\n", o->shm);
			return r;
		}
		if (err != -ENOENT && err != -ENODATA && err != -EPROTO)
			runtime_error("cannot attach to region", o->shm, err,
				      "check the path and its permissions");
		if (!may_overwrite(o->shm))
			runtime_error("refusing to format", o->shm, -EEXIST,
				      "the file holds something that is not an ivtrace "
				      "region; pass --create to overwrite it");
	}
	if (o->ivshmem_socket)
		err = create_fitting(o, &r);
	else
		err = ivt_region_create(o->shm, &o->region, &r);
	if (err == -EINVAL)
		runtime_error("cannot create region", o->shm, err,
			      "the geometry is out of range: --channels 1..4096, "
			      "--subbufs 2..65536, --subbuf-size 4K..16M (powers of two)");
	if (err == -EPERM && o->ivshmem_socket)
		runtime_error("cannot format the server's region", o->shm, err,
			      "its size is fixed (sealed) and too small for "
			      "--channels x --subbuf-size x 2 sub-buffers: pass "
			      "fewer --channels or a smaller --subbuf-size");
	if (err)
		runtime_error("cannot create region", o->shm, err,
			      "is the directory writable, and is there room "
			      "(df /dev/shm)?");
	return r;
}

static void register_payload(struct ivt_region *r, const struct opts *o,
			     struct ivt_event *ev)
{
	const struct ivt_field fields[] = {
		{ "thread", IVT_FT_U16, 0, 0 },
		{ "seq", IVT_FT_U64, 0, 0 },
		{ "data", o->binary ? IVT_FT_BYTES : IVT_FT_STRING, 0, 0 },
	};
	int err = ivt_event_register(r, "loadgen:payload", fields, 3, ev);

	if (err == -EEXIST)
		runtime_error("cannot register loadgen:payload in", o->shm, err,
			      "the region already describes it with other fields "
			      "(another --payload?); use --create or a fresh region");
	if (err)
		runtime_error("cannot register loadgen:payload in", o->shm, err,
			      "the metadata area is full or corrupt; use --create");
}

/* ---- the writers ------------------------------------------------------ */

static int write_one(struct worker *w, uint64_t seq)
{
	const struct opts *o = w->o;
	uint32_t len = data_len(o, w->t, seq), size = payload_size(o, len);
	const uint8_t *data = data_of(o, w->ramp, w->t, seq);
	uint8_t *p = ivt_reserve(w->ev, size);

	if (!p)
		return 0;
	p = ivt_put_u16(p, (uint16_t)w->t);
	p = ivt_put_u64(p, seq);
	if (o->binary)
		ivt_put_bytes(p, data, len);
	else
		ivt_put_string(p, (const char *)data, len);
	ivt_commit(w->ev);
	w->bytes += size;
	return 1;
}

/*
 * Sleep until `done` events are due at `rate`. Never spin on the clock: in
 * a guest without a stable TSC, clock_gettime() is a real system call, and
 * a spin would flood the trace with syscall events. Deadlines count from
 * `start`, so a late wake-up shortens the next wait and the average rate
 * stays exact.
 */
static void pace(uint64_t start, uint64_t done, uint64_t rate)
{
	uint64_t due = start + (uint64_t)((unsigned __int128)done * 1000000000u / rate);

	if (now_ns() < due)
		sleep_until(due);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	const struct opts *o = w->o;
	uint64_t batch = o->rate ? (o->rate + 999) / 1000 : o->events;
	uint64_t seq = 0, start = now_ns();

	while (seq < o->events) {
		uint64_t end = o->events - seq < batch ? o->events : seq + batch;

		for (; seq < end; seq++)
			w->written += (uint64_t)write_one(w, seq);
		if (o->rate)
			pace(start, seq, o->rate);
	}
	w->elapsed_ns = now_ns() - start;
	w->attempted = o->events;
	w->dropped = w->attempted - w->written;
	/* Close our last packet so a reader sees it, and free the channel. */
	ivt_thread_release(w->region);
	return NULL;
}

/* ---- reporting -------------------------------------------------------- */

static double ns_per_event(uint64_t ns, uint64_t events)
{
	return events ? (double)ns / (double)events : 0.0;
}

static double mb_per_s(uint64_t bytes, uint64_t ns)
{
	return ns ? (double)bytes * 1e3 / (double)ns : 0.0;
}

struct totals {
	uint64_t attempted, written, dropped, bytes, thread_ns, wall_ns;
};

static void sum(const struct worker *w, uint32_t n, uint64_t wall_ns,
		struct totals *tot)
{
	uint32_t i;

	memset(tot, 0, sizeof(*tot));
	for (i = 0; i < n; i++) {
		tot->attempted += w[i].attempted;
		tot->written += w[i].written;
		tot->dropped += w[i].dropped;
		tot->bytes += w[i].bytes;
		tot->thread_ns += w[i].elapsed_ns;
	}
	tot->wall_ns = wall_ns;
}

static void print_human(const struct opts *o, const struct ivt_region_info *ri,
			const struct worker *w, const struct totals *tot,
			const struct ivt_stats *st)
{
	uint32_t i;

	fprintf(stderr, PROG ": %s: %s region, %u channels x %u x %u KiB, %s\n",
		o->shm, ri->created ? "formatted" : "attached to",
		ri->nr_channels - ri->nr_kernel_channels, ri->nr_subbufs,
		ri->subbuf_size >> 10, mode_name(ri->mode));
	fprintf(stderr, "%-7s %12s %12s %12s %10s %10s\n",
		"thread", "events", "written", "dropped", "ns/event", "MB/s");
	for (i = 0; i < o->threads; i++)
		fprintf(stderr, "%-7u %12" PRIu64 " %12" PRIu64 " %12" PRIu64
			" %10.1f %10.1f\n", i, w[i].attempted, w[i].written,
			w[i].dropped, ns_per_event(w[i].elapsed_ns, w[i].attempted),
			mb_per_s(w[i].bytes, w[i].elapsed_ns));
	fprintf(stderr, "%-7s %12" PRIu64 " %12" PRIu64 " %12" PRIu64
		" %10.1f %10.1f\n", "total", tot->attempted, tot->written,
		tot->dropped, ns_per_event(tot->thread_ns, tot->attempted),
		mb_per_s(tot->bytes, tot->wall_ns));
	fprintf(stderr, "region drops: full %" PRIu64 ", too big %" PRIu64
		", nested %" PRIu64 ", no channel %" PRIu64 "\n",
		st->lost_full, st->lost_too_big, st->lost_nested,
		st->lost_no_channel);
}

static void json_string(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

/* One set of counts; `ns` is the time they took (a thread's write loop,
 * or the whole run for the total), `ns_ev` the mean cost of one event. */
static void json_counts(uint64_t attempted, uint64_t written, uint64_t dropped,
			uint64_t bytes, uint64_t ns, double ns_ev)
{
	printf("{\"attempted\":%" PRIu64 ",\"written\":%" PRIu64
	       ",\"dropped\":%" PRIu64 ",\"payload_bytes\":%" PRIu64
	       ",\"elapsed_ns\":%" PRIu64 ",\"ns_per_event\":%.3f"
	       ",\"mb_per_s\":%.3f", attempted, written, dropped, bytes, ns,
	       ns_ev, mb_per_s(bytes, ns));
}

static void print_json(const struct opts *o, const struct ivt_region_info *ri,
		       const struct ivt_event *ev, const struct worker *w,
		       const struct totals *tot, const struct ivt_stats *st,
		       int closed)
{
	uint32_t i;

	printf("{\"tool\":\"" PROG "\",\"shm\":");
	json_string(o->shm);
	printf(",\"created\":%s,\"closed\":%s", ri->created ? "true" : "false",
	       closed ? "true" : "false");
	printf(",\"region\":{\"size\":%" PRIu64 ",\"uuid\":\"", ri->size);
	for (i = 0; i < 16; i++)
		printf("%02x%s", ri->uuid[i], i == 3 || i == 5 || i == 7 || i == 9 ? "-" : "");
	printf("\",\"channels\":%u,\"kernel_channels\":%u,\"subbufs\":%u"
	       ",\"subbuf_size\":%u,\"mode\":\"%s\",\"freq_hz\":%" PRIu64 "}",
	       ri->nr_channels, ri->nr_kernel_channels, ri->nr_subbufs,
	       ri->subbuf_size, mode_name(ri->mode), ri->freq_hz);
	printf(",\"event\":{\"name\":\"loadgen:payload\",\"id\":%u}", ev->id);
	printf(",\"threads\":%u,\"events_per_thread\":%" PRIu64
	       ",\"size_min\":%u,\"size_max\":%u,\"payload\":\"%s\",\"rate\":%" PRIu64,
	       o->threads, o->events, o->size_min, o->size_max,
	       o->binary ? "binary" : "text", o->rate);
	printf(",\"attempted\":%" PRIu64 ",\"written\":%" PRIu64 ",\"dropped\":%" PRIu64,
	       tot->attempted, tot->written, tot->dropped);
	printf(",\"per_thread\":[");
	for (i = 0; i < o->threads; i++) {
		printf(i ? "," : "");
		json_counts(w[i].attempted, w[i].written, w[i].dropped,
			    w[i].bytes, w[i].elapsed_ns,
			    ns_per_event(w[i].elapsed_ns, w[i].attempted));
		printf(",\"thread\":%u}", i);
	}
	/* total: elapsed_ns and mb_per_s over the whole run (wall clock);
	 * ns_per_event is the threads' mean write-loop cost per event. */
	printf("],\"total\":");
	json_counts(tot->attempted, tot->written, tot->dropped, tot->bytes,
		    tot->wall_ns, ns_per_event(tot->thread_ns, tot->attempted));
	printf("}");
	printf(",\"stats\":{\"lost_full\":%" PRIu64 ",\"lost_too_big\":%" PRIu64
	       ",\"lost_nested\":%" PRIu64 ",\"lost_no_channel\":%" PRIu64 "}}\n",
	       st->lost_full, st->lost_too_big, st->lost_nested,
	       st->lost_no_channel);
}

/* ---- main --------------------------------------------------------------- */

static void run_workers(struct worker *w, const struct opts *o)
{
	uint32_t i;
	int err;

	for (i = 0; i < o->threads; i++) {
		err = pthread_create(&w[i].thread, NULL, worker_main, &w[i]);
		if (err) {
			fprintf(stderr, PROG ": cannot start writer thread %u: %s\n"
				"  hint: lower --threads\n", i, strerror(err));
			exit(EXIT_RUNTIME);
		}
	}
	for (i = 0; i < o->threads; i++)
		pthread_join(w[i].thread, NULL);
}

int main(int argc, char **argv)
{
	struct ivt_region_info ri;
	struct ivt_region *r;
	struct ivt_stats st;
	struct ivt_event ev;
	struct worker *w;
	struct totals tot;
	struct opts o;
	uint8_t *ramp;
	uint64_t t0;
	uint32_t i;

	parse_args(&o, argc, argv);
	if (o.ivshmem_socket)
		ivshmem_connect(&o);
	ramp = make_ramp(&o);
	w = calloc(o.threads, sizeof(*w));
	if (!ramp || !w)
		runtime_error("cannot allocate buffers for", o.shm, -ENOMEM, NULL);

	r = open_region(&o);
	register_payload(r, &o, &ev);
	if (o.ivshmem_socket)
		wait_for_host(r);
	for (i = 0; i < o.threads; i++)
		w[i] = (struct worker){ .t = i, .o = &o, .ev = &ev,
					.region = r, .ramp = ramp };
	t0 = now_ns();
	run_workers(w, &o);
	sum(w, o.threads, now_ns() - t0, &tot);

	ivt_region_info(r, &ri);
	ivt_stats(r, &st);
	print_human(&o, &ri, w, &tot, &st);
	if (o.json)
		print_json(&o, &ri, &ev, w, &tot, &st, !o.no_close && ri.created);
	if (!o.no_close)
		ivt_region_close(r);
	fprintf(stderr, "%s\n", o.no_close ? "region left live (--no-close)" :
		ri.created ? "region closed" : "region left to its creator (attached)");
	free(w);
	free(ramp);
	return fflush(stdout) ? EXIT_RUNTIME : 0;
}
