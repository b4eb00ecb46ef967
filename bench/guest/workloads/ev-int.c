// SPDX-License-Identifier: MIT
/*
 * ev-int - a CPU-bound integer benchmark in the spirit of Dhrystone 2
 * (our own code, not Dhrystone's): each loop does record assignments through
 * pointers, enum and integer arithmetic, small fixed-size string copies and
 * compares, 1-D and 2-D array updates and a handful of non-inlined calls.
 * No system call and no memory allocation inside the timed loop, so a tracer
 * of scheduler, timer, interrupt and memory events sees only what the
 * machine does around it (ticks, the reader's own work).
 *
 *   ev-int [-t SECONDS]        (default 10)
 *   EVWL workload=int score=<loops/s> unit=loops/s ops=<loops> elapsed=<s>
 *
 * The clock is read every 4096 loops.
 */
#include "evwl.h"

enum colour { RED, GREEN, BLUE, CYAN, MAGENTA };

struct rec {
	struct rec *next;
	enum colour col;
	int id;
	int val;
	char name[32];
};

static struct rec recs[2];
static struct rec *glob;
static int arr1[64];
static int arr2[64][64];
static char gstr1[32], gstr2[32];
static int gint;
static char gch1, gch2;
static volatile uint64_t sink;

#define NOINLINE __attribute__((noinline))

static NOINLINE enum colour pick(char a, char b)
{
	return a == b ? GREEN : RED;
}

static NOINLINE int strings_differ(const char *a, const char *b)
{
	int i;

	for (i = 2; i <= 2; i++)
		if (pick(a[i], b[i + 1]) == RED)
			gch2 = 'A';
	if (strcmp(a, b) > 0) {
		gint = i + 7;
		return 1;
	}
	return 0;
}

static NOINLINE void arrays(int *a1, int a2[64][64], int x, int y)
{
	int k = x + 5;

	a1[k] = y;
	a1[k + 1] = a1[k];
	a1[k + 30] = k;
	for (int j = k; j <= k + 1; j++)
		a2[k][j] = k;
	a2[k][k - 1] += 1;
	a2[k + 20][k] = a1[k];
	gint = 5;
}

static NOINLINE int add3(int a, int b)
{
	return a + b + 3;
}

static NOINLINE enum colour shade(enum colour c, int n)
{
	switch (c) {
	case RED:
		return n > 100 ? BLUE : GREEN;
	case GREEN:
		return gint > 100 ? RED : CYAN;
	case BLUE:
		return MAGENTA;
	case CYAN:
		return RED;
	default:
		return BLUE;
	}
}

static NOINLINE void touch(struct rec *r)
{
	struct rec *n = r->next;

	*n = *glob;
	r->val = 5;
	n->val = r->val;
	n->next = r->next;
	n->col = shade(r->col, n->val);
	if (n->col == RED || n->col == MAGENTA) {
		n->val = 6;
		n->id = add3(n->val, gint);
	} else {
		*r = *n;
	}
}

int main(int argc, char **argv)
{
	double secs = evwl_seconds(argc, argv, 10.0), t0, t;
	uint64_t loops = 0;
	int a = 0, b = 0, c = 0;
	enum colour col = RED;

	recs[0].next = &recs[1];
	recs[0].col = BLUE;
	recs[0].id = 1;
	recs[0].val = 40;
	strcpy(recs[0].name, "EV-INT, SOME RECORD NAME STR");
	recs[1] = recs[0];
	glob = &recs[0];
	strcpy(gstr1, "EV-INT, THE FIRST STRING OF 30");
	arr2[8][7] = 10;

	t0 = evwl_now();
	for (;;) {
		for (int i = 0; i < 4096; i++) {
			a = 2;
			b = 3;
			strcpy(gstr2, "EV-INT, THE 2ND STRING OF 30");
			gch1 = 'A';
			col = strings_differ(gstr1, gstr2) ? GREEN : BLUE;
			while (a < b) {
				c = 5 * a - b;
				c = add3(a, c);
				a++;
			}
			arrays(arr1, arr2, a, c);
			touch(glob);
			for (char ch = 'A'; ch <= gch2; ch++)
				if (col == pick(ch, 'C'))
					c = a + 1;
			b = b * a;
			a = b / c;
			b = 7 * (b - c) - a;
			c = add3(a, b) & 0xff;
			col = shade(col, c);
		}
		loops += 4096;
		t = evwl_now() - t0;
		if (t >= secs)
			break;
	}
	sink = (uint64_t)a + (uint64_t)b + (uint64_t)c + (uint64_t)col + (uint64_t)arr1[8] +
	       (uint64_t)arr2[8][8] + (uint64_t)recs[1].val;
	evwl_result("int", (double)loops / t, "loops/s", loops, t);
	return 0;
}
