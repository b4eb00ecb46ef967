/* SPDX-License-Identifier: MIT */
/*
 * b_kernel.c - the baselines and the kernel-side tracers: the empty timed
 * region, rdtsc, getppid(2), ftrace trace_marker and trace_marker_raw (in a tracefs
 * instance of our own, so the global buffer is left alone), and write(2) of
 * the same 32 bytes to a file on tmpfs and on the disk filesystem.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "ivbench.h"

/* ---- empty: the timing sequence alone -------------------------------- */

#define EMPTY_WRITE(p)	__asm__ __volatile__("" : : "r"(p) : "memory")
IVB_LOOPS(empty, EMPTY_WRITE)

const struct ivb_bench ivb_bench_empty = {
	.name = "empty",
	.what = "nothing: the cost of the timing sequence itself (subtracted from every other row)",
	.sample = empty_sample,
	.group = empty_group,
	.batch = empty_batch,
};

/* ---- rdtsc: the clock read every ivtrace event pays, for scale -------- */

static uint64_t rdtsc_sink;
#define RDTSC_WRITE(p)	(rdtsc_sink += __builtin_ia32_rdtsc() + (p)->a)
IVB_LOOPS(rdtsc, RDTSC_WRITE)

const struct ivb_bench ivb_bench_rdtsc = {
	.name = "rdtsc",
	.what = "one rdtsc, no tracing (the timestamp every ivtrace event takes; scale for the ivtrace rows)",
	.sample = rdtsc_sample,
	.group = rdtsc_group,
	.batch = rdtsc_batch,
};

/* ---- getppid: the cheapest system call, for scale -------------------- */

static uint64_t getppid_sink;
#define GETPPID_WRITE(p)	(getppid_sink += (uint64_t)getppid() + (p)->a)
IVB_LOOPS(getppid, GETPPID_WRITE)

const struct ivb_bench ivb_bench_getppid = {
	.name = "getppid",
	.what = "getppid(2): one system call round trip, no tracing (scale for the syscall-based rows)",
	.sample = getppid_sample,
	.group = getppid_group,
	.batch = getppid_batch,
};

/* ---- helpers for the file-descriptor tracers -------------------------- */

struct fd_bench {
	const char *name;
	char path[512];
	int fd;
	uint64_t errors;	/* writes that did not write the whole event */
	int last_errno;
};

static void fd_check_round(struct fd_bench *b)
{
	if (b->errors)
		ivb_die(b->name, "%llu writes to %s failed or were short (last: %s)",
			(unsigned long long)b->errors, b->path,
			strerror(b->last_errno));
}

static inline __attribute__((always_inline)) void
fd_write(struct fd_bench *b, const void *buf, size_t len)
{
	ssize_t n = write(b->fd, buf, len);

	if (__builtin_expect(n != (ssize_t)len, 0)) {
		b->errors++;
		b->last_errno = n < 0 ? errno : EIO;
	}
}

/* Write `val` to the tracefs file `dir`/`file`; 0 or -errno. */
static int tracefs_put(const char *dir, const char *file, const char *val)
{
	char path[512];
	int fd, ret = 0;

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	fd = open(path, O_WRONLY | O_TRUNC);
	if (fd < 0)
		return -errno;
	if (write(fd, val, strlen(val)) != (ssize_t)strlen(val))
		ret = -errno;
	close(fd);
	return ret;
}

static void tracefs_get(const char *dir, const char *file, char *buf, size_t len)
{
	char path[512];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	buf[0] = 0;
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return;
	n = read(fd, buf, len - 1);
	buf[n > 0 ? n : 0] = 0;
	close(fd);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		buf[--n] = 0;
}

/* Create (if needed) and switch on our tracefs instance. */
static void tracefs_instance_setup(const char *bench)
{
	const char *dir = ivb_opts.tracefs;
	char parent[512], *slash;
	struct stat st;
	int ret;

	snprintf(parent, sizeof(parent), "%s", dir);
	slash = strrchr(parent, '/');
	if (slash)
		*slash = 0;
	if (stat(parent, &st) != 0)
		ivb_die(bench, "%s does not exist: tracefs is not mounted "
			"(mount -t tracefs nodev /sys/kernel/tracing, as root)", parent);
	if (mkdir(dir, 0755) != 0 && errno != EEXIST)
		ivb_die(bench, "cannot create the tracefs instance %s: %s", dir, strerror(errno));
	ret = tracefs_put(dir, "buffer_size_kb", "16384");
	if (!ret)
		ret = tracefs_put(dir, "tracing_on", "1");
	if (ret)
		ivb_die(bench, "cannot configure the tracefs instance %s: %s", dir, strerror(-ret));
}

/* JSON members describing the instance after the run. */
static void tracefs_report(FILE *f)
{
	char path[64], buf[1024], *line, *save;

	tracefs_get(ivb_opts.tracefs, "buffer_size_kb", buf, sizeof(buf));
	fprintf(f, "\"tracefs_instance\": ");
	ivb_json_str(f, ivb_opts.tracefs);
	fprintf(f, ",\n\"buffer_size_kb\": ");
	ivb_json_str(f, buf);
	tracefs_get(ivb_opts.tracefs, "options/overwrite", buf, sizeof(buf));
	fprintf(f, ",\n\"overwrite\": ");
	ivb_json_str(f, buf);
	tracefs_get(ivb_opts.tracefs, "trace_clock", buf, sizeof(buf));
	fprintf(f, ",\n\"trace_clock\": ");
	ivb_json_str(f, buf);
	/* per_cpu stats: "entries: N", "overrun: N", ... as JSON members. */
	snprintf(path, sizeof(path), "per_cpu/cpu%d/stats", ivb_opts.cpu);
	tracefs_get(ivb_opts.tracefs, path, buf, sizeof(buf));
	fprintf(f, ",\n\"cpu_stats\": {");
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *colon = strchr(line, ':');

		if (!colon)
			continue;
		*colon = 0;
		fprintf(f, "%s", line == buf ? "" : ", ");
		ivb_json_str(f, line);
		fprintf(f, ": ");
		for (colon++; *colon == ' '; colon++)
			;
		ivb_json_str(f, colon);
	}
	fprintf(f, "},\n");
}

/* ---- ftrace trace_marker: 32 binary bytes ----------------------------- */

static struct fd_bench marker = { .name = "trace_marker", .fd = -1 };

static void marker_setup(void)
{
	tracefs_instance_setup(marker.name);
	snprintf(marker.path, sizeof(marker.path), "%s/trace_marker", ivb_opts.tracefs);
	marker.fd = open(marker.path, O_WRONLY);
	if (marker.fd < 0)
		ivb_die(marker.name, "cannot open %s: %s", marker.path, strerror(errno));
}

static void marker_round_teardown(unsigned round)
{
	(void)round;
	fd_check_round(&marker);
}

static void marker_teardown(void)
{
	close(marker.fd);
}

#define MARKER_WRITE(p)	fd_write(&marker, (p), sizeof(*(p)))
IVB_LOOPS(marker, MARKER_WRITE)

const struct ivb_bench ivb_bench_marker = {
	.name = "trace_marker",
	.what = "write(2) of the 32 payload bytes to tracefs trace_marker (own instance, tracing on, 16 MiB/CPU, default overwrite)",
	.setup = marker_setup,
	.sample = marker_sample,
	.group = marker_group,
	.batch = marker_batch,
	.round_teardown = marker_round_teardown,
	.report = tracefs_report,
	.teardown = marker_teardown,
};

/* ---- ftrace trace_marker_raw: u32 id + the 32 payload bytes ----------- */

struct raw_event {
	uint32_t id;
	struct ivb_payload p;
} __attribute__((packed));

static struct fd_bench marker_raw = { .name = "trace_marker_raw", .fd = -1 };

static void marker_raw_setup(void)
{
	tracefs_instance_setup(marker_raw.name);
	snprintf(marker_raw.path, sizeof(marker_raw.path), "%s/trace_marker_raw",
		 ivb_opts.tracefs);
	marker_raw.fd = open(marker_raw.path, O_WRONLY);
	if (marker_raw.fd < 0)
		ivb_die(marker_raw.name, "cannot open %s: %s (kernel without trace_marker_raw?)",
			marker_raw.path, strerror(errno));
}

static void marker_raw_round_teardown(unsigned round)
{
	(void)round;
	fd_check_round(&marker_raw);
}

static void marker_raw_teardown(void)
{
	close(marker_raw.fd);
}

static inline __attribute__((always_inline)) void
marker_raw_write(const struct ivb_payload *p)
{
	struct raw_event ev = { .id = 1, .p = *p };

	fd_write(&marker_raw, &ev, sizeof(ev));
}

IVB_LOOPS(marker_raw, marker_raw_write)

const struct ivb_bench ivb_bench_marker_raw = {
	.name = "trace_marker_raw",
	.what = "write(2) of a u32 id + the 32 payload bytes (36 B) to tracefs trace_marker_raw (same instance)",
	.setup = marker_raw_setup,
	.sample = marker_raw_sample,
	.group = marker_raw_group,
	.batch = marker_raw_batch,
	.round_teardown = marker_raw_round_teardown,
	.report = tracefs_report,
	.teardown = marker_raw_teardown,
};

/* ---- write(2) of 32 bytes to a regular file --------------------------- */

static const char *fs_name(const char *path)
{
	struct statfs sf;

	if (statfs(path, &sf) != 0)
		return "unknown";
	switch ((unsigned long)sf.f_type) {
	case 0x01021994: return "tmpfs";
	case 0xEF53: return "ext4";		/* also ext2/ext3 */
	case 0x58465342: return "xfs";
	case 0x9123683E: return "btrfs";
	case 0x794c7630: return "overlayfs";
	default: return "other";
	}
}

static void file_setup(struct fd_bench *b, const char *dir)
{
	snprintf(b->path, sizeof(b->path), "%s/ivbench-%d.write", dir, (int)getpid());
	b->fd = open(b->path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (b->fd < 0)
		ivb_die(b->name, "cannot create %s: %s", b->path, strerror(errno));
}

/* Each round starts from an empty file: the file grows by appending. */
static void file_round_setup(struct fd_bench *b)
{
	if (ftruncate(b->fd, 0) != 0 || lseek(b->fd, 0, SEEK_SET) != 0)
		ivb_die(b->name, "cannot truncate %s: %s", b->path, strerror(errno));
}

static void file_report(struct fd_bench *b, FILE *f)
{
	fprintf(f, "\"file\": ");
	ivb_json_str(f, b->path);
	fprintf(f, ",\n\"filesystem\": ");
	ivb_json_str(f, fs_name(b->path));
	fprintf(f, ",\n");
}

static void file_teardown(struct fd_bench *b)
{
	close(b->fd);
	unlink(b->path);
}

static struct fd_bench wtmpfs = { .name = "write_tmpfs", .fd = -1 };
static struct fd_bench wdisk = { .name = "write_disk", .fd = -1 };

static void wtmpfs_setup(void) { file_setup(&wtmpfs, ivb_opts.shm_dir); }
static void wtmpfs_round_setup(unsigned r) { (void)r; file_round_setup(&wtmpfs); }
static void wtmpfs_round_teardown(unsigned r) { (void)r; fd_check_round(&wtmpfs); }
static void wtmpfs_report(FILE *f) { file_report(&wtmpfs, f); }
static void wtmpfs_teardown(void) { file_teardown(&wtmpfs); }
#define WTMPFS_WRITE(p)	fd_write(&wtmpfs, (p), sizeof(*(p)))
IVB_LOOPS(wtmpfs, WTMPFS_WRITE)

const struct ivb_bench ivb_bench_write_tmpfs = {
	.name = "write_tmpfs",
	.what = "write(2) of the 32 payload bytes, appending to a file in /dev/shm (tmpfs)",
	.setup = wtmpfs_setup,
	.round_setup = wtmpfs_round_setup,
	.sample = wtmpfs_sample,
	.group = wtmpfs_group,
	.batch = wtmpfs_batch,
	.round_teardown = wtmpfs_round_teardown,
	.report = wtmpfs_report,
	.teardown = wtmpfs_teardown,
};

static void wdisk_setup(void) { file_setup(&wdisk, ivb_opts.disk_dir); }
static void wdisk_round_setup(unsigned r) { (void)r; file_round_setup(&wdisk); }
static void wdisk_round_teardown(unsigned r) { (void)r; fd_check_round(&wdisk); }
static void wdisk_report(FILE *f) { file_report(&wdisk, f); }
static void wdisk_teardown(void) { file_teardown(&wdisk); }
#define WDISK_WRITE(p)	fd_write(&wdisk, (p), sizeof(*(p)))
IVB_LOOPS(wdisk, WDISK_WRITE)

const struct ivb_bench ivb_bench_write_disk = {
	.name = "write_disk",
	.what = "write(2) of the 32 payload bytes, appending to a file on the root disk filesystem (page cache, no fsync)",
	.setup = wdisk_setup,
	.round_setup = wdisk_round_setup,
	.sample = wdisk_sample,
	.group = wdisk_group,
	.batch = wdisk_batch,
	.round_teardown = wdisk_round_teardown,
	.report = wdisk_report,
	.teardown = wdisk_teardown,
};
