/* SPDX-License-Identifier: MIT */
/*
 * loadgen: ivtrace-loadgen ($IVT_LOADGEN) writes exactly the documented
 * payload: every event of every thread is recomputed here from (t, seq)
 * with the formulas of its --help, for fixed and ranged sizes, text and
 * binary data. Also its exit codes: 0 ok (drops included), 1 usage,
 * 2 runtime error.
 */
#include <fcntl.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "t.h"
#include "walker.h"

#define THREADS 3
#define N 3000u

extern char **environ;

static uint64_t splitmix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ z >> 27) * 0x94d049bb133111ebull;
	return z ^ z >> 31;
}

struct expect {
	uint32_t lo, hi;
	int binary;
	uint64_t next[THREADS];
	int chan_thread;
};

static uint8_t want_byte(const struct expect *x, uint32_t t, uint64_t seq,
			 uint32_t i)
{
	uint64_t k = seq * 131 + (uint64_t)t * 7 + i;

	return x->binary ? (uint8_t)k : (uint8_t)(0x21 + k % 94);
}

static int check(const struct w_event *e, void *arg)
{
	struct expect *x = arg;
	uint16_t t = w_u16(e->payload);
	uint64_t seq = w_u64(e->payload + 2);
	const uint8_t *data = e->payload + 10;
	uint32_t len, want, i;

	T_CHECK(t < THREADS);
	if (x->chan_thread < 0)
		x->chan_thread = t;
	T_EQ(t, x->chan_thread);
	T_EQ(seq, x->next[t]);
	x->next[t]++;
	want = x->lo == x->hi ? x->lo :
	       x->lo + (uint32_t)(splitmix64(((uint64_t)t << 40) ^ seq) % (x->hi - x->lo + 1));
	if (x->binary) {
		len = w_u32(data);
		data += 4;
		T_EQ(e->len, 10 + 4 + len);
	} else {
		len = e->len - 10 - 1;		/* the walker found the NUL */
		T_EQ(data[len], 0);
	}
	T_EQ(len, want);
	for (i = 0; i < len; i++)
		if (data[i] != want_byte(x, t, seq, i))
			t_fail(__FILE__, __LINE__, "t %u seq %lu byte %u: %u", t,
			       (unsigned long)seq, i, data[i]);
	return 0;
}

static int run(char *const argv[])
{
	posix_spawn_file_actions_t fa;
	int status;
	pid_t pid;

	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
	T_OK(posix_spawn(&pid, argv[0], &fa, NULL, argv, environ));
	posix_spawn_file_actions_destroy(&fa);
	T_EQ(waitpid(pid, &status, 0), pid);
	T_CHECK(WIFEXITED(status));
	return WEXITSTATUS(status);
}

static void check_run(const char *lg, const char *size, uint32_t lo, uint32_t hi,
		      int binary)
{
	const char *path = t_path("loadgen");
	char *argv[] = { (char *)lg, "--shm", (char *)path, "--events", "3000",
			 "--threads", "3", "--size", (char *)size, "--channels", "4",
			 "--subbufs", "64", "--subbuf-size", "16K", "--json",
			 binary ? "--payload" : NULL, "binary", NULL };
	struct expect x;
	struct w_region wr;
	uint32_t c, t;

	T_EQ(run(argv), 0);
	memset(&x, 0, sizeof(x));
	x.lo = lo;
	x.hi = hi;
	x.binary = binary;
	T_OK(w_open(&wr, path) ? -EIO : 0);
	T_EQ(wr.hdr->state, IVT_STATE_CLOSED);
	T_CHECK(!strcmp(wr.types[0].name, "loadgen:payload"));
	T_EQ(wr.types[0].fields[2].type, binary ? IVT_FT_BYTES : IVT_FT_STRING);
	for (c = 0; c < wr.l.nr_channels; c++) {
		struct w_chan ci;

		x.chan_thread = -1;
		if (w_walk_channel(&wr, c, check, NULL, &x, &ci))
			t_fail(__FILE__, __LINE__, "walk: %s", w_error);
	}
	for (t = 0; t < THREADS; t++)
		T_EQ(x.next[t], N);
	w_close(&wr);
}

int main(void)
{
	const char *lg = getenv("IVT_LOADGEN");
	char *usage[] = { (char *)lg, "--shm", "/dev/shm/x", "--bogus", NULL };
	char *nopath[] = { (char *)lg, "--events", "1", NULL };
	char *badsize[] = { (char *)lg, "--shm", "/dev/shm/x", "--size", "9-3", NULL };
	char *badkind[] = { (char *)lg, "--shm", "/dev/shm/x", "--payload", "utf16", NULL };
	char *runtime[] = { (char *)lg, "--shm", "/nonexistent-dir/x", "--events", "1", NULL };

	if (!lg || access(lg, X_OK))
		t_skip("set IVT_LOADGEN to the ivtrace-loadgen binary");
	check_run(lg, "24", 24, 24, 1);
	check_run(lg, "0-300", 0, 300, 1);
	check_run(lg, "24", 24, 24, 0);
	check_run(lg, "1-300", 1, 300, 0);
	T_EQ(run(usage), 1);
	T_EQ(run(nopath), 1);
	T_EQ(run(badsize), 1);
	T_EQ(run(badkind), 1);
	T_EQ(run(runtime), 2);
	return T_PASS;
}
