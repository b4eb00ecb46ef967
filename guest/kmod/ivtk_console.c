// SPDX-License-Identifier: GPL-2.0
/*
 * ivtk_console.c - the kernel log as printk_console events.
 *
 * A console receives every formatted record (with its "[ time]" prefix),
 * including the last lines of a panic: each line is committed as it is
 * written, so the host salvages it from commit_pos without any flush.
 * CON_PRINTBUFFER replays the log written before the module loaded.
 *
 * CON_ENABLED must be preset: with console= on the command line,
 * register_console() silently skips a console whose name no console=
 * option matches unless it is already enabled (docs/guest-kernel.md "Capturing printk").
 *
 * write() runs under console_lock with interrupts off (and, at panic,
 * on the panicking CPU with the others stopped); it must not sleep or
 * printk.
 *
 * A console only sees records at or above the console log level (all but
 * warnings and worse are dropped with `quiet`; loglevel=8 or dmesg -n 8
 * lets everything through, to every console). With
 * printk_source=tracepoint the module instead probes the "console"
 * tracepoint (printk_sprint()), as lttng-modules does for its
 * printk_console event: every record at every level, when it is stored,
 * without the "[ time]" prefix.
 */
#include <linux/console.h>
#include <linux/string.h>

#include "ivtk.h"

/*
 * Write one printk_console event: @n bytes of @s without the trailing
 * newline. Any context (the console's, a printk caller's, NMI).
 */
void ivtk_write_printk(const char *s, size_t n)
{
	struct ivt_writer *w;
	unsigned long flags;
	size_t i;
	u8 *p;

	while (n && (s[n - 1] == '\n' || s[n - 1] == '\r'))
		n--;
	n = min_t(size_t, n, IVTK_CONSOLE_MAX);

	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_PRINTK_CONSOLE,
			 IVT_KEV_PRINTK_CONSOLE_SIZE + n);
	if (p) {
		u8 *end = ivt_put_string(p, s, n);

		/* A NUL inside would end the string early and leave the
		 * rest unparsable: the host would drop the whole packet.
		 */
		if (unlikely(memchr(s, 0, n)))
			for (i = 0; i < n; i++)
				if (!p[i])
					p[i] = ' ';
		ivtk_commit(w, end);
	}
	local_irq_restore(flags);
}

static void ivtk_console_write(struct console *con, const char *s,
			       unsigned int n)
{
	if (READ_ONCE(ivtk_groups) & BIT(IVTRACE_GROUP_PRINTK))
		ivtk_write_printk(s, n);
}

static struct console ivtk_console = {
	.name = IVTK_NAME,
	.write = ivtk_console_write,
	.flags = CON_ENABLED | CON_PRINTBUFFER,
	.index = 0,
};

static bool ivtk_console_listed(void)
{
	struct console *c;
	bool found = false;

	console_lock();
	for_each_console(c)
		if (c == &ivtk_console)
			found = true;
	console_unlock();
	return found;
}

void ivtk_console_register(struct ivtk_dev *d)
{
	if (ivtk_printk_tracepoint)
		return;		/* the printk group's probe on "console" instead */
	/* unregister_console() clears CON_ENABLED and register_console()
	 * may set other flags: start from the same state on every bind.
	 */
	ivtk_console.flags = CON_ENABLED | CON_PRINTBUFFER;
	ivtk_console.index = 0;
	register_console(&ivtk_console);
	d->console_on = ivtk_console_listed();
	if (!d->console_on)
		dev_warn(&d->pdev->dev, "console not registered (flags 0x%x): no printk_console events\n",
			 ivtk_console.flags);
}

void ivtk_console_unregister(struct ivtk_dev *d)
{
	if (d->console_on)
		unregister_console(&ivtk_console);
	d->console_on = false;
}
