/* SPDX-License-Identifier: MIT */
/*
 * abi_vectors.c - print the ABI's sizes, offsets and constants as JSON.
 *
 * `make -C abi vectors` writes abi/vectors.json from this program; the
 * abi test fails if the committed file differs, and the Rust reader's
 * tests (host/ring) check its own layout against the same file. One
 * definition (abi.h), two checked mirrors.
 */
#include <stdio.h>
#include <ivtrace/abi.h>
#include <ivtrace/ftrace.h>

static int first = 1;

static void item(const char *name, unsigned long long v)
{
	printf("%s\n  \"%s\": %llu", first ? "" : ",", name, v);
	first = 0;
}

#define SIZE(t)		item("sizeof." #t, sizeof(struct t))
#define OFF(t, f)	item("offsetof." #t "." #f, offsetof(struct t, f))
#define CONST(c)	item(#c, (unsigned long long)(c))

/* Every structure of the ABI: its size. */
static void sizes(void)
{
	SIZE(ivt_region_hdr); SIZE(ivt_layout); SIZE(ivt_clock);
	SIZE(ivt_sync); SIZE(ivt_control); SIZE(ivt_channel);
	SIZE(ivt_packet_hdr); SIZE(ivt_event_ext); SIZE(ivt_meta_rec);
	SIZE(ivt_meta_field); SIZE(ivt_name_entry); SIZE(ivt_names_rec);
	SIZE(ivt_ctl_text); SIZE(ivt_ftrace_rec);
}

/* The region header and the records in it that the host reads and writes. */
static void region_offsets(void)
{
	OFF(ivt_region_hdr, magic); OFF(ivt_region_hdr, abi_major);
	OFF(ivt_region_hdr, abi_minor); OFF(ivt_region_hdr, hdr_size);
	OFF(ivt_region_hdr, region_size); OFF(ivt_region_hdr, features);
	OFF(ivt_region_hdr, uuid); OFF(ivt_region_hdr, default_mode);
	OFF(ivt_region_hdr, owner_pid); OFF(ivt_region_hdr, layout);
	OFF(ivt_region_hdr, clock); OFF(ivt_region_hdr, state);
	OFF(ivt_region_hdr, meta_tail); OFF(ivt_region_hdr, next_event_id);
	OFF(ivt_region_hdr, lost_no_channel); OFF(ivt_region_hdr, doorbells);
	OFF(ivt_region_hdr, host_sleeping); OFF(ivt_region_hdr, host_peer_id);
	OFF(ivt_region_hdr, host_vector); OFF(ivt_region_hdr, host_heartbeat);
	OFF(ivt_region_hdr, flush_interval_ms); OFF(ivt_region_hdr, control);
	OFF(ivt_region_hdr, sync); OFF(ivt_region_hdr, nr_ftrace_channels);
	OFF(ivt_region_hdr, ctl_text);
	OFF(ivt_ctl_text, req); OFF(ivt_ctl_text, resp_len);
	OFF(ivt_ctl_text, resp_flags); OFF(ivt_ctl_text, resp);
	OFF(ivt_ftrace_rec, len); OFF(ivt_ftrace_rec, commit);
	OFF(ivt_ftrace_rec, kind); OFF(ivt_ftrace_rec, what);
	OFF(ivt_ftrace_rec, text_len); OFF(ivt_ftrace_rec, system);
	OFF(ivt_ftrace_rec, text);
}

/* The layout, clock, control and sync blocks, and a channel's shared counters. */
static void block_offsets(void)
{
	OFF(ivt_layout, channels_off); OFF(ivt_layout, meta_off);
	OFF(ivt_layout, pool_off); OFF(ivt_layout, meta_size);
	OFF(ivt_layout, nr_channels); OFF(ivt_layout, nr_kernel_channels);
	OFF(ivt_layout, channel_size); OFF(ivt_layout, nr_subbufs);
	OFF(ivt_layout, subbuf_size);

	OFF(ivt_clock, freq_hz); OFF(ivt_clock, source);
	OFF(ivt_clock, ref_ticks); OFF(ivt_clock, ref_realtime_ns);

	OFF(ivt_control, cmd_seq); OFF(ivt_control, cmd); OFF(ivt_control, arg);
	OFF(ivt_control, ack_seq); OFF(ivt_control, ack_status);
	OFF(ivt_control, groups_enabled);

	OFF(ivt_sync, req_seq); OFF(ivt_sync, host_t1); OFF(ivt_sync, resp_seq);
	OFF(ivt_sync, resp_t2); OFF(ivt_sync, resp_t3); OFF(ivt_sync, resp_spun);

	OFF(ivt_channel, commit_pos); OFF(ivt_channel, open_seq);
	OFF(ivt_channel, lost_full); OFF(ivt_channel, lost_too_big);
	OFF(ivt_channel, lost_nested); OFF(ivt_channel, mode);
	OFF(ivt_channel, stream); OFF(ivt_channel, cpu);
	OFF(ivt_channel, events_closed); OFF(ivt_channel, state);
	OFF(ivt_channel, owner_pid); OFF(ivt_channel, owner_tid);
	OFF(ivt_channel, claims); OFF(ivt_channel, consumed);
}

/* What the rings and the metadata area hold: packet headers, event and name records. */
static void record_offsets(void)
{
	OFF(ivt_packet_hdr, magic); OFF(ivt_packet_hdr, stream_id);
	OFF(ivt_packet_hdr, stream_instance_id);
	OFF(ivt_packet_hdr, timestamp_begin); OFF(ivt_packet_hdr, timestamp_end);
	OFF(ivt_packet_hdr, content_size); OFF(ivt_packet_hdr, packet_size);
	OFF(ivt_packet_hdr, packet_seq_num);
	OFF(ivt_packet_hdr, events_discarded);
	OFF(ivt_packet_hdr, first_event_seq); OFF(ivt_packet_hdr, event_count);
	OFF(ivt_packet_hdr, cpu_id); OFF(ivt_packet_hdr, owner_pid);
	OFF(ivt_packet_hdr, owner_tid);

	OFF(ivt_meta_rec, len); OFF(ivt_meta_rec, commit); OFF(ivt_meta_rec, kind);
	OFF(ivt_meta_rec, nr_fields); OFF(ivt_meta_rec, event_id);
	OFF(ivt_meta_rec, stream); OFF(ivt_meta_rec, group);
	OFF(ivt_meta_rec, name); OFF(ivt_meta_rec, fields);
	OFF(ivt_meta_field, name); OFF(ivt_meta_field, type);
	OFF(ivt_meta_field, flags); OFF(ivt_meta_field, count);
	OFF(ivt_name_entry, tid); OFF(ivt_name_entry, seq); OFF(ivt_name_entry, ts);
	OFF(ivt_name_entry, comm);
	OFF(ivt_names_rec, len); OFF(ivt_names_rec, commit); OFF(ivt_names_rec, kind);
	OFF(ivt_names_rec, nr_entries); OFF(ivt_names_rec, updates);
	OFF(ivt_names_rec, skipped); OFF(ivt_names_rec, entries);
}

/* The constants both sides must agree on: magic numbers, limits, features, modes,
 * commands, event encodings and field types. */
static void constants(void)
{
	CONST(IVT_MAGIC); CONST(IVT_ABI_MAJOR); CONST(IVT_ABI_MINOR);
	CONST(IVT_PAGE_SIZE); CONST(IVT_REGION_MIN); CONST(IVT_SUBBUF_MIN);
	CONST(IVT_SUBBUF_MAX); CONST(IVT_SUBBUFS_MIN); CONST(IVT_SUBBUFS_MAX);
	CONST(IVT_CHANNELS_MAX); CONST(IVT_EVENT_IDS_MAX);
	CONST(IVT_FEAT_KERNEL); CONST(IVT_FEAT_LOOPBACK); CONST(IVT_FEAT_DOORBELL);
	CONST(IVT_FEAT_CONTROL); CONST(IVT_FEAT_SYNC); CONST(IVT_FEAT_FTRACE);
	CONST(IVT_FEAT_SYNC_SPIN); CONST(IVT_SYNC_ROUNDS); CONST(IVT_SYNC_PATIENCE_NS);
	CONST(IVT_SYNC_BUDGET_NS); CONST(IVT_SYNC_POLL_MS);
	CONST(IVT_STATE_FORMATTING); CONST(IVT_STATE_LIVE); CONST(IVT_STATE_CLOSED);
	CONST(IVT_MODE_DISCARD); CONST(IVT_MODE_OVERWRITE);
	CONST(IVT_CHAN_FREE); CONST(IVT_CHAN_ACTIVE); CONST(IVT_CHAN_RETIRED);
	CONST(IVT_STREAM_KERNEL); CONST(IVT_STREAM_USER); CONST(IVT_STREAM_COUNT);
	CONST(IVT_STREAM_FTRACE); CONST(IVT_STREAM_CLASSES);
	CONST(IVT_CLOCK_TSC);
	CONST(IVT_CMD_NONE); CONST(IVT_CMD_FLUSH); CONST(IVT_CMD_ENABLE);
	CONST(IVT_CMD_DISABLE); CONST(IVT_CMD_SET_MODE); CONST(IVT_CMD_SYNC); CONST(IVT_CMD_STATEDUMP);
	CONST(IVT_CMD_FTRACE); CONST(IVT_CTL_REQ_MAX); CONST(IVT_CTL_RESP_MAX);
	CONST(IVT_CTL_RESP_MORE);
	CONST(IVT_HC_BASE); CONST(IVT_HC_VMSYNC); CONST(IVT_HC_EVENT_FIRST);
	CONST(IVT_HC_EVENT_LAST);
	CONST(IVT_CTF_MAGIC); CONST(IVT_EVENT_COUNT_UNKNOWN);
	CONST(IVT_EV_ID_BITS); CONST(IVT_EV_ID_EXTENDED); CONST(IVT_EV_COMPACT_MAX_ID);
	CONST(IVT_EV_TS_BITS); CONST(IVT_EV_ALIGN); CONST(IVT_EV_COMPACT_SIZE);
	CONST(IVT_EV_EXT_SIZE);
	CONST(IVT_META_COMMIT); CONST(IVT_META_EVENT); CONST(IVT_META_NAMES);
	CONST(IVT_META_FTRACE); CONST(IVT_FTRACE_HEADER_PAGE); CONST(IVT_FTRACE_FORMAT);
	CONST(IVT_FTRACE_TEXT_MAX); CONST(IVT_FTRACE_SYSTEM_MAX);
	CONST(IVT_FTRACE_EV_PAGE); CONST(IVT_FTRACE_EV_STATS); CONST(IVT_FTRACE_EV_SYMBOLS);
	CONST(IVT_FTRACE_STAT_COUNT); CONST(IVT_FTRACE_PAGE_MAX);
	CONST(IVT_NAME_DEAD); CONST(IVT_NAME_MAX);
	CONST(IVT_FIELD_NAME_MAX); CONST(IVT_FIELDS_MAX);
	CONST(IVT_FT_U8); CONST(IVT_FT_U16); CONST(IVT_FT_U32); CONST(IVT_FT_U64);
	CONST(IVT_FT_S8); CONST(IVT_FT_S16); CONST(IVT_FT_S32); CONST(IVT_FT_S64);
	CONST(IVT_FT_STRING); CONST(IVT_FT_BYTES); CONST(IVT_FT_CHARS);
	CONST(IVT_FT_MAX); CONST(IVT_FF_HEX); CONST(IVT_FF_TID_COMM);
}

int main(void)
{
	printf("{");
	sizes();
	region_offsets();
	block_offsets();
	record_offsets();
	constants();
	printf("\n}\n");
	return 0;
}
