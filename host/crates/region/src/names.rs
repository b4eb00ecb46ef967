//! The thread name table the guest kernel module keeps in the metadata
//! area (`struct ivt_names_rec`, abi.h; docs/abi.md "Thread name table"):
//! every thread's latest name, outside the rings, so that a salvaged
//! flight-recorder trace can name threads whose naming events the rings
//! overwrote.
//!
//! [`read_thread_names`] finds the record by walking the committed records
//! from the start of the metadata area, then reads its entries with the
//! seqcount protocol: every entry's `seq` (acquire), one bounded copy of all
//! entries, an acquire fence, every `seq` again; an entry whose `seq` was
//! odd or changed is torn and left out (counted). Everything read is
//! guest data: counts are bounded by the record's length and the area, and
//! names are raw bytes for the caller to sanitize.

use crate::abi;
use crate::bytes::{le_u16, le_u32, le_u64};
use crate::region::Region;

/// `IVT_META_NAMES`: the record kind of the name table.
pub const IVT_META_NAMES: u16 = 2;
/// `IVT_NAME_DEAD`: tid flag of an entry whose thread was freed.
pub const IVT_NAME_DEAD: u32 = 1 << 31;
/// `sizeof(struct ivt_names_rec)`: the record's header.
pub const NAMES_REC_SIZE: usize = 64;
/// `sizeof(struct ivt_name_entry)`.
pub const NAME_ENTRY_SIZE: usize = 32;

/// Offsets in `struct ivt_names_rec` and `struct ivt_name_entry`.
pub mod off {
    pub const NR_ENTRIES: usize = 12;
    pub const UPDATES: usize = 16;
    pub const SKIPPED: usize = 24;
    pub const ENTRIES: usize = 64;
    pub const ENTRY_TID: usize = 0;
    pub const ENTRY_SEQ: usize = 4;
    pub const ENTRY_TS: usize = 8;
    pub const ENTRY_COMM: usize = 16;
}

/// One thread's latest name, as the guest wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameEntry {
    pub tid: u32,
    /// The thread was freed (its name is still the last it had).
    pub dead: bool,
    /// Writer clock when the name was set.
    pub ts: u64,
    /// Raw, NUL-padded bytes (guest data: sanitize before use).
    pub comm: [u8; 16],
}

/// The table, read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameTable {
    pub entries: Vec<NameEntry>,
    /// Entries left out: being written when read (or left half-written by
    /// a writer that died).
    pub torn: u64,
    /// The guest's counts: names written, updates it gave up.
    pub updates: u64,
    pub skipped: u64,
}

/// Offset (from the metadata area) and length of the committed name table
/// record, if the area has one. Walks records as `MetaParser` does and
/// stops at the first uncommitted or malformed one.
fn find_record(region: &Region) -> Option<(u64, u32)> {
    let layout = *region.layout();
    // Relaxed: a bound only; each record's commit (acquire) orders it.
    let tail = u64::from(
        region
            .load_relaxed_u32(abi::hdr::META_TAIL as u64)
            .min(layout.meta_size),
    );
    // at and len are below meta_size (a u32): no sum here overflows a u64,
    // and the loads and copies check their bounds against the region.
    let mut at = 0u64;
    while at.saturating_add(abi::META_REC_SIZE as u64) <= tail {
        let base = layout.meta_off.saturating_add(at);
        // Pairs with the store-release of `commit` by the record's writer
        // (ivtk_names_start() for this record, ivt_event_register() and
        // ivtk_meta_publish() for event records).
        let field = |f: usize| base.saturating_add(f as u64);
        if region.load_acquire_u32(field(abi::meta::COMMIT)) != abi::IVT_META_COMMIT {
            return None;
        }
        let len = region.load_relaxed_u32(field(abi::meta::LEN));
        let end = at.saturating_add(u64::from(len));
        if (len as usize) < abi::META_REC_SIZE || !len.is_multiple_of(8) || end > tail {
            return None;
        }
        let mut kind = [0u8; 2];
        region.copy_out(field(abi::meta::KIND), &mut kind);
        if le_u16(&kind, 0) == IVT_META_NAMES {
            return Some((base, len));
        }
        at = end;
    }
    None
}

/// The thread name table of `region`, if its writer keeps one.
pub fn read_thread_names(region: &Region) -> Option<NameTable> {
    let (base, len) = find_record(region)?;
    let mut head = [0u8; NAMES_REC_SIZE];
    if !region.copy_out(base, &mut head) {
        return None;
    }
    let room = (len as usize).saturating_sub(NAMES_REC_SIZE) / NAME_ENTRY_SIZE;
    let nr = (le_u32(&head, off::NR_ENTRIES) as usize).min(room);
    // nr entries fit in the record (room): these offsets stay inside it.
    let entries_at = base.saturating_add(off::ENTRIES as u64);
    let seq_at = |i: usize| {
        let within = i
            .saturating_mul(NAME_ENTRY_SIZE)
            .saturating_add(off::ENTRY_SEQ);
        entries_at.saturating_add(within as u64)
    };
    // Pairs with the store-release of `seq` in ivtk_name_unlock(): an even
    // value read here means the entry's bytes before it are complete.
    let before: Vec<u32> = (0..nr)
        .map(|i| region.load_acquire_u32(seq_at(i)))
        .collect();
    let mut bytes = vec![0u8; nr.saturating_mul(NAME_ENTRY_SIZE)];
    if !region.copy_out(entries_at, &mut bytes) {
        return None;
    }
    // Orders the copy before the re-reads: a writer that changed an entry
    // during the copy has moved its seq (its cmpxchg is a full barrier).
    region.fence_acquire();
    let mut table = NameTable {
        updates: le_u64(&head, off::UPDATES),
        skipped: le_u64(&head, off::SKIPPED),
        ..NameTable::default()
    };
    for (i, e) in bytes.chunks_exact(NAME_ENTRY_SIZE).enumerate() {
        let raw_tid = le_u32(e, off::ENTRY_TID);
        let tid = raw_tid & !IVT_NAME_DEAD;
        let after = region.load_relaxed_u32(seq_at(i));
        if before[i] & 1 == 1 || after != before[i] {
            table.torn = table.torn.saturating_add(1);
            continue;
        }
        if tid == 0 {
            continue;
        }
        let mut comm = [0u8; 16];
        comm.copy_from_slice(&e[off::ENTRY_COMM..off::ENTRY_COMM + 16]);
        table.entries.push(NameEntry {
            tid,
            dead: raw_tid & IVT_NAME_DEAD != 0,
            ts: le_u64(e, off::ENTRY_TS),
            comm,
        });
    }
    Some(table)
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::region::Access;
    use ivtrace_testutil::RegionBuilder;

    #[test]
    fn layout_matches_abi_vectors() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../abi/vectors.json");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let want = [
            ("IVT_META_NAMES", IVT_META_NAMES as u64),
            ("IVT_NAME_DEAD", IVT_NAME_DEAD as u64),
            ("sizeof.ivt_names_rec", NAMES_REC_SIZE as u64),
            ("sizeof.ivt_name_entry", NAME_ENTRY_SIZE as u64),
            ("offsetof.ivt_names_rec.nr_entries", off::NR_ENTRIES as u64),
            ("offsetof.ivt_names_rec.updates", off::UPDATES as u64),
            ("offsetof.ivt_names_rec.skipped", off::SKIPPED as u64),
            ("offsetof.ivt_names_rec.entries", off::ENTRIES as u64),
            ("offsetof.ivt_name_entry.tid", off::ENTRY_TID as u64),
            ("offsetof.ivt_name_entry.seq", off::ENTRY_SEQ as u64),
            ("offsetof.ivt_name_entry.ts", off::ENTRY_TS as u64),
            ("offsetof.ivt_name_entry.comm", off::ENTRY_COMM as u64),
        ];
        for (name, ours) in want {
            assert_eq!(v[name].as_u64(), Some(ours), "{name}");
        }
    }

    /// A names record: `entries` as (tid word, seq, ts, name).
    fn record(entries: &[(u32, u32, u64, &str)], nr: u32) -> Vec<u8> {
        let len = NAMES_REC_SIZE + nr as usize * NAME_ENTRY_SIZE;
        let mut r = vec![0u8; len];
        r[0..4].copy_from_slice(&(len as u32).to_le_bytes());
        r[4..8].copy_from_slice(&abi::IVT_META_COMMIT.to_le_bytes());
        r[8..10].copy_from_slice(&IVT_META_NAMES.to_le_bytes());
        r[12..16].copy_from_slice(&nr.to_le_bytes());
        r[16..24].copy_from_slice(&7u64.to_le_bytes());
        r[24..32].copy_from_slice(&1u64.to_le_bytes());
        for (i, (tid, seq, ts, name)) in entries.iter().enumerate() {
            let e = NAMES_REC_SIZE + i * NAME_ENTRY_SIZE;
            r[e..e + 4].copy_from_slice(&tid.to_le_bytes());
            r[e + 4..e + 8].copy_from_slice(&seq.to_le_bytes());
            r[e + 8..e + 16].copy_from_slice(&ts.to_le_bytes());
            r[e + 16..e + 16 + name.len()].copy_from_slice(name.as_bytes());
        }
        r
    }

    #[test]
    fn entries_are_read_after_the_event_records_torn_ones_left_out() {
        let mut r = RegionBuilder::new(2, 4, 4096).kernel(1).build_region();
        r.register_kernel_events();
        let entries = [
            (42, 2, 100, "db-writer"),
            (43 | IVT_NAME_DEAD, 4, 200, "gone"),
            (44, 3, 300, "half-written"), // odd seq: torn
            (0, 0, 0, ""),                // free
        ];
        r.append_meta(&record(&entries, 8));
        let region = Region::from_bytes(&r.bytes, Access::ReadOnly).unwrap();
        let t = read_thread_names(&region).expect("a table");
        assert_eq!((t.torn, t.updates, t.skipped), (1, 7, 1));
        let names: Vec<(u32, bool, &[u8])> = t
            .entries
            .iter()
            .map(|e| (e.tid, e.dead, &e.comm[..]))
            .collect();
        assert_eq!(names.len(), 2);
        assert_eq!((names[0].0, names[0].1), (42, false));
        assert!(names[0].2.starts_with(b"db-writer\0"));
        assert_eq!((names[1].0, names[1].1), (43, true));
    }

    #[test]
    fn a_lying_entry_count_is_bounded_by_the_record() {
        let mut r = RegionBuilder::new(2, 4, 4096).kernel(1).build_region();
        let mut rec = record(&[(5, 2, 1, "five")], 2);
        rec[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        r.append_meta(&rec);
        let region = Region::from_bytes(&r.bytes, Access::ReadOnly).unwrap();
        let t = read_thread_names(&region).expect("a table");
        assert_eq!(t.entries.len(), 1);
    }

    #[test]
    fn no_table_without_the_record() {
        let mut r = RegionBuilder::new(2, 4, 4096).kernel(1).build_region();
        r.register_kernel_events();
        let region = Region::from_bytes(&r.bytes, Access::ReadOnly).unwrap();
        assert_eq!(read_thread_names(&region), None);
    }
}
