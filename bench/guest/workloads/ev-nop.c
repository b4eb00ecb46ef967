// SPDX-License-Identifier: MIT
/* ev-nop - exits 0 at once: the program ev-forkexec executes. Static, no libc
 * start-up work worth mentioning. */
int main(void)
{
	return 0;
}
