/* SPDX-License-Identifier: MIT */
/*
 * dbserver - a raw ivshmem server for one QEMU: the host side of the doorbell
 * benchmark, and the doorbell check of tests/vm. The product's server is
 * `ivtrace serve`; this one exists because measuring the doorbell itself needs
 * a host that only answers it (see bench/README.md). The handshake is the one
 * docs/ivshmem.md describes: version 0, the guest's id, -1 + shm fd, host id 1
 * x vectors, the guest's id x vectors; one 8-byte message and at most one fd
 * per sendmsg. Then a responder thread on vector 0:
 *
 *   guest: shm[REQ] = n; ring (1 << 16) | 0      host: wake on eventfd 0,
 *          spin until shm[REPLY] == n                  shm[REPLY] = shm[REQ]
 *
 * The responder either blocks in read(2) on the eventfd (a sleeping host,
 * as ivtrace serve is when idle) or busy-reads it non-blocking (a polling
 * host); the guest picks with shm[MODE]. Doorbells on vector 0 are counted
 * per phase (shm[PHASE], set by the guest). On QEMU's EOF it prints one JSON
 * object: the per-phase counts of vector 0 and the count of every vector.
 *
 *   dbserver SOCKET SHM_BYTES [GUEST_ID]        (GUEST_ID: 0 by default)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define VECTORS 2
#define HOST_ID 1
#define PHASES 16

/* u64 word indices in the shared memory (one cache line each). */
enum { W_REQ = 0, W_REPLY = 8, W_MODE = 16, W_PHASE = 24 };

static volatile uint64_t *shm;
static int host_rx[VECTORS], guest_rx[VECTORS];
static uint64_t per_phase[PHASES];
static atomic_int stop;

static int send_msg(int sock, int64_t v, int fd)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = &v, .iov_len = sizeof(v) };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };

	memset(cbuf, 0, sizeof(cbuf));
	if (fd >= 0) {
		struct cmsghdr *c;

		m.msg_control = cbuf;
		m.msg_controllen = sizeof(cbuf);
		c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	return sendmsg(sock, &m, MSG_NOSIGNAL) == (ssize_t)sizeof(v) ? 0 : -1;
}

static void *responder(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		uint64_t v;
		ssize_t n;
		int spin = __atomic_load_n(&shm[W_MODE], __ATOMIC_RELAXED) == 1;

		if (spin) {
			n = read(host_rx[0], &v, sizeof(v));	/* non-blocking fd */
			if (n < 0)
				continue;
		} else {
			struct pollfd p = { .fd = host_rx[0], .events = POLLIN };

			if (poll(&p, 1, 200) <= 0)
				continue;
			n = read(host_rx[0], &v, sizeof(v));
			if (n < 0)
				continue;
		}
		/* Answer: the guest spins on REPLY. Release: ordered after
		 * our read of REQ (acquire), the guest reads REPLY only. */
		uint64_t req = __atomic_load_n(&shm[W_REQ], __ATOMIC_ACQUIRE);
		__atomic_store_n(&shm[W_REPLY], req, __ATOMIC_RELEASE);
		uint64_t ph = __atomic_load_n(&shm[W_PHASE], __ATOMIC_RELAXED);
		per_phase[ph < PHASES ? ph : PHASES - 1] += v;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	uint64_t size, per_vector[VECTORS] = { 0 };
	int lfd, c, mfd, i, guest_id;
	pthread_t t;

	if (argc != 3 && argc != 4) {
		fprintf(stderr, "usage: dbserver SOCKET SHM_BYTES [GUEST_ID]\n");
		return 2;
	}
	size = strtoull(argv[2], NULL, 0);
	guest_id = argc == 4 ? atoi(argv[3]) : 0;
	if (guest_id < 0 || guest_id > 65535 || guest_id == HOST_ID) {
		fprintf(stderr, "dbserver: GUEST_ID must be 0..65535 and not %d (the host)\n",
			HOST_ID);
		return 2;
	}
	mfd = memfd_create("dbbench", MFD_CLOEXEC);
	if (mfd < 0 || ftruncate(mfd, (off_t)size))
		return perror("memfd"), 1;
	shm = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (shm == MAP_FAILED)
		return perror("mmap"), 1;
	for (i = 0; i < VECTORS; i++) {
		host_rx[i] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		guest_rx[i] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	}
	strncpy(a.sun_path, argv[1], sizeof(a.sun_path) - 1);
	unlink(argv[1]);
	lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || bind(lfd, (void *)&a, sizeof(a)) || listen(lfd, 1))
		return perror("listen"), 1;
	fprintf(stderr, "dbserver: listening on %s\n", argv[1]);
	c = accept(lfd, NULL, NULL);
	if (c < 0)
		return perror("accept"), 1;
	if (send_msg(c, 0, -1) || send_msg(c, guest_id, -1) || send_msg(c, -1, mfd))
		return perror("handshake"), 1;
	for (i = 0; i < VECTORS; i++)
		if (send_msg(c, HOST_ID, host_rx[i]))
			return perror("handshake"), 1;
	for (i = 0; i < VECTORS; i++)
		if (send_msg(c, guest_id, guest_rx[i]))
			return perror("handshake"), 1;
	pthread_create(&t, NULL, responder, NULL);
	for (;;) {	/* QEMU never sends: wait for its EOF */
		char b[64];
		ssize_t n = read(c, b, sizeof(b));

		if (n == 0 || (n < 0 && errno != EINTR))
			break;
	}
	atomic_store(&stop, 1);
	pthread_join(t, NULL);
	{
		uint64_t v;

		if (read(host_rx[0], &v, sizeof(v)) == sizeof(v))
			per_phase[0] += v;
		for (i = 0; i < PHASES; i++)
			per_vector[0] += per_phase[i];
		for (i = 1; i < VECTORS; i++)	/* nobody waits on these: read once */
			if (read(host_rx[i], &v, sizeof(v)) == sizeof(v))
				per_vector[i] = v;
	}
	printf("{\"doorbells_per_phase\": [");
	for (i = 0; i < PHASES; i++)
		printf("%s%llu", i ? ", " : "", (unsigned long long)per_phase[i]);
	printf("], \"doorbells_per_vector\": [");
	for (i = 0; i < VECTORS; i++)
		printf("%s%llu", i ? ", " : "", (unsigned long long)per_vector[i]);
	printf("]}\n");
	unlink(argv[1]);
	return 0;
}
