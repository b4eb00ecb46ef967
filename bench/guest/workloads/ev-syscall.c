// SPDX-License-Identifier: MIT
/*
 * ev-syscall - a system-call-heavy loop. One operation is:
 *   getppid(); open()+read(64 B)+close() of a tmpfs file; write(64 B) and
 *   read(64 B) through a pipe; stat() of the file; lseek()+write(64 B) of a
 *   scratch file.
 * i.e. 9 system calls, among them the file-table and slab allocations of
 * open/close (kmem events) and no sleep.
 *
 *   ev-syscall [-t SECONDS] [-d DIR]     (default 10 s, /tmp)
 *   EVWL workload=syscall score=<ops/s> unit=ops/s ops=<n> elapsed=<s>
 */
#include "evwl.h"
#include <fcntl.h>
#include <sys/stat.h>

int main(int argc, char **argv)
{
	double secs = evwl_seconds(argc, argv, 10.0), t0, t;
	const char *dir = "/tmp";
	char path[256], scratch[256], buf[64];
	int pfd[2], sfd;
	uint64_t ops = 0;
	struct stat st;

	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], "-d"))
			dir = argv[i + 1];
	snprintf(path, sizeof(path), "%s/ev-syscall.%d", dir, (int)getpid());
	snprintf(scratch, sizeof(scratch), "%s/ev-syscall-w.%d", dir, (int)getpid());
	memset(buf, 'x', sizeof(buf));
	sfd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
	if (sfd < 0 || write(sfd, buf, sizeof(buf)) != sizeof(buf) || close(sfd))
		EVWL_DIE("ev-syscall: %s: %s", path, strerror(errno));
	sfd = open(scratch, O_CREAT | O_TRUNC | O_RDWR, 0600);
	if (sfd < 0 || pipe(pfd))
		EVWL_DIE("ev-syscall: set-up: %s", strerror(errno));

	t0 = evwl_now();
	for (;;) {
		for (int i = 0; i < 256; i++) {
			int fd;

			getppid();
			fd = open(path, O_RDONLY);
			if (fd < 0 || read(fd, buf, sizeof(buf)) != sizeof(buf))
				EVWL_DIE("ev-syscall: read %s: %s", path, strerror(errno));
			close(fd);
			if (write(pfd[1], buf, sizeof(buf)) != sizeof(buf) ||
			    read(pfd[0], buf, sizeof(buf)) != sizeof(buf))
				EVWL_DIE("ev-syscall: pipe: %s", strerror(errno));
			if (stat(path, &st))
				EVWL_DIE("ev-syscall: stat: %s", strerror(errno));
			if (lseek(sfd, 0, SEEK_SET) < 0 || write(sfd, buf, sizeof(buf)) != sizeof(buf))
				EVWL_DIE("ev-syscall: write: %s", strerror(errno));
		}
		ops += 256;
		t = evwl_now() - t0;
		if (t >= secs)
			break;
	}
	unlink(path);
	unlink(scratch);
	evwl_result("syscall", (double)ops / t, "ops/s", ops, t);
	return 0;
}
