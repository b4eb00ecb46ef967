// SPDX-License-Identifier: MIT
/*
 * ev-forkexec - process creation: fork(), execve() of a static no-op program
 * in the child, waitpid() in the parent. One operation = one child that ran
 * and exited 0.
 *
 *   ev-forkexec [-t SECONDS] [-p PROGRAM]     (default 10 s, ev-nop beside
 *                                              this binary, else on PATH)
 *   EVWL workload=forkexec score=<ops/s> unit=ops/s ops=<n> elapsed=<s>
 */
#include "evwl.h"
#include <sys/wait.h>

int main(int argc, char **argv)
{
	double secs = evwl_seconds(argc, argv, 10.0), t0, t;
	char prog[512] = "/usr/local/bin/ev-nop";
	char *const cargv[] = { "ev-nop", NULL };
	char *const cenv[] = { NULL };
	uint64_t ops = 0;

	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], "-p"))
			snprintf(prog, sizeof(prog), "%s", argv[i + 1]);
	if (access(prog, X_OK))
		EVWL_DIE("ev-forkexec: %s: %s", prog, strerror(errno));

	t0 = evwl_now();
	for (;;) {
		int st;
		pid_t p = fork();

		if (p < 0)
			EVWL_DIE("ev-forkexec: fork: %s", strerror(errno));
		if (p == 0) {
			execve(prog, cargv, cenv);
			_exit(127);
		}
		if (waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st))
			EVWL_DIE("ev-forkexec: child failed (status %#x)", st);
		ops++;
		t = evwl_now() - t0;
		if (t >= secs)
			break;
	}
	evwl_result("forkexec", (double)ops / t, "ops/s", ops, t);
	return 0;
}
