//! Thread names over time, and the interrupt names of the state dump.
//!
//! [`ThreadNamesBuilder`] takes `(tid, time, name)` facts in time order
//! (the naming events of every CPU, merged by timestamp) and keeps one entry
//! per *change* of a thread's name, so repeated state dumps cost nothing.
//! [`ThreadNames::lookup`] answers "what was thread `tid` called at time
//! `t`": the latest name at or before `t`, else the earliest later one.
//!
//! Every name is guest text: [`sanitize_comm`] makes it at most 15 bytes of
//! valid UTF-8 with no control characters, quotes or backslashes, NUL-padded
//! to 16 bytes. The number of entries is capped ([`MAX_NAME_ENTRIES`]) so a
//! guest that invents millions of threads costs bounded memory; names past
//! the cap are counted, not kept.

use std::collections::HashMap;

/// Bytes of a thread name field (`TASK_COMM_LEN`, LTTng's `char[16]`).
pub const COMM_LEN: usize = 16;
/// A thread name as it goes into the trace: NUL-padded UTF-8.
pub type Comm = [u8; COMM_LEN];

/// Name changes kept at most (32 bytes each: 128 MiB). Linux allows at
/// most 2^22 thread ids at a time (`PID_MAX_LIMIT`).
pub const MAX_NAME_ENTRIES: usize = 1 << 22;
/// Interrupts whose names are kept at most.
pub const MAX_IRQS: usize = 1 << 16;
/// Bytes of one interrupt's name (its actions joined by ",").
pub const IRQ_NAME_MAX: usize = 127;

/// Appends the characters of `raw` (up to its first NUL) to `out`: valid
/// UTF-8 except control characters, `"` and `\`, which become `?`, as do
/// the bytes of invalid sequences. Never writes more bytes than it reads,
/// and stops before `out` would exceed `max` bytes.
fn push_clean(raw: &[u8], out: &mut Vec<u8>, max: usize) {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    for chunk in raw[..end].utf8_chunks() {
        for c in chunk.valid().chars() {
            let mut tmp = [0u8; 4];
            let bytes: &[u8] = if c.is_control() || c == '"' || c == '\\' {
                b"?"
            } else {
                c.encode_utf8(&mut tmp).as_bytes()
            };
            if out.len() + bytes.len() > max {
                return;
            }
            out.extend_from_slice(bytes);
        }
        for _ in chunk.invalid() {
            if out.len() + 1 > max {
                return;
            }
            out.push(b'?');
        }
    }
}

/// A guest thread name made safe: at most 15 bytes (a multi-byte
/// character that would straddle byte 15 is left out), NUL-padded.
pub fn sanitize_comm(raw: &[u8]) -> Comm {
    let mut clean = Vec::with_capacity(COMM_LEN);
    push_clean(raw, &mut clean, COMM_LEN - 1);
    let mut comm = [0u8; COMM_LEN];
    comm[..clean.len()].copy_from_slice(&clean);
    comm
}

/// `swapper/<cpu>`, the idle thread's name (tid 0) on `cpu`.
pub fn swapper(cpu: u32) -> Comm {
    let mut comm = [0u8; COMM_LEN];
    let mut text = [0u8; 24];
    let n = {
        use std::io::Write;
        let mut cur = std::io::Cursor::new(&mut text[..]);
        let _ = write!(cur, "swapper/{cpu}");
        cur.position() as usize
    };
    let n = n.min(COMM_LEN - 1);
    comm[..n].copy_from_slice(&text[..n]);
    comm
}

/// Collects name facts in time order.
#[derive(Debug)]
pub struct ThreadNamesBuilder {
    /// (tid, time, name), in the order added (time order).
    entries: Vec<(u32, u64, Comm)>,
    /// tid -> index of its latest entry.
    latest: HashMap<u32, u32>,
    max_entries: usize,
    /// Facts that repeated the thread's current name.
    pub repeated: u64,
    /// Name changes not kept because the table was full.
    pub dropped: u64,
}

impl Default for ThreadNamesBuilder {
    fn default() -> Self {
        ThreadNamesBuilder::with_limit(MAX_NAME_ENTRIES)
    }
}

impl ThreadNamesBuilder {
    /// A builder keeping at most `max_entries` name changes.
    pub fn with_limit(max_entries: usize) -> Self {
        ThreadNamesBuilder {
            entries: Vec::new(),
            latest: HashMap::new(),
            max_entries,
            repeated: 0,
            dropped: 0,
        }
    }

    /// Thread `tid` is called `name` from time `ts` on. Calls must come in
    /// time order (ties in any order: the last one added wins).
    pub fn add(&mut self, tid: u32, ts: u64, name: Comm) {
        if let Some(&i) = self.latest.get(&tid) {
            if self.entries[i as usize].2 == name {
                self.repeated += 1;
                return;
            }
        }
        if self.entries.len() >= self.max_entries {
            self.dropped += 1;
            return;
        }
        self.latest.insert(tid, self.entries.len() as u32);
        self.entries.push((tid, ts, name));
    }

    /// The lookup table.
    pub fn build(self) -> ThreadNames {
        let ThreadNamesBuilder {
            mut entries,
            latest,
            ..
        } = self;
        let threads = latest.len();
        drop(latest);
        // Stable: equal (tid, time) keep the order they were added in.
        entries.sort_by_key(|e| (e.0, e.1));
        let mut index = HashMap::with_capacity(threads);
        let mut start = 0usize;
        while start < entries.len() {
            let tid = entries[start].0;
            let len = entries[start..].iter().take_while(|e| e.0 == tid).count();
            index.insert(tid, (start as u32, len as u32));
            start += len;
        }
        let entries = entries.into_iter().map(|(_, t, n)| (t, n)).collect();
        ThreadNames { index, entries }
    }
}

/// The answer of [`ThreadNames::lookup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Name<'a> {
    /// The latest name at or before the time asked.
    AtOrBefore(&'a Comm),
    /// The thread had no name yet: its earliest later one.
    Later(&'a Comm),
    /// The thread is never named.
    Unknown,
}

/// Thread names over time, for lookups.
#[derive(Debug, Default)]
pub struct ThreadNames {
    /// tid -> (first entry, entries), entries sorted by time.
    index: HashMap<u32, (u32, u32)>,
    entries: Vec<(u64, Comm)>,
}

impl ThreadNames {
    /// The name of thread `tid` at time `ts`.
    #[inline]
    pub fn lookup(&self, tid: u32, ts: u64) -> Name<'_> {
        let Some(&(start, len)) = self.index.get(&tid) else {
            return Name::Unknown;
        };
        let run = &self.entries[start as usize..(start + len) as usize];
        let i = if len == 1 {
            (run[0].0 <= ts) as usize
        } else {
            run.partition_point(|e| e.0 <= ts)
        };
        match i {
            0 => Name::Later(&run[0].1),
            i => Name::AtOrBefore(&run[i - 1].1),
        }
    }

    /// Threads with at least one name.
    pub fn threads(&self) -> usize {
        self.index.len()
    }

    /// Name changes kept.
    pub fn entries(&self) -> usize {
        self.entries.len()
    }
}

/// Names from the guest's thread name table (ivtrace-ring's `names`), for
/// threads that no naming event in the trace names: a flight recorder's
/// rings keep only the newest packets, so the state dump and the forks of
/// long-lived threads are the first to go. Sanitized like every name;
/// bounded by the table, which the metadata area bounds.
#[derive(Debug, Default)]
pub struct TableNames {
    names: HashMap<u32, Comm>,
}

impl TableNames {
    pub fn new(table: &ivtrace_region::names::NameTable) -> TableNames {
        let names = table
            .entries
            .iter()
            .map(|e| (e.tid, sanitize_comm(&e.comm)))
            .filter(|(_, c)| c[0] != 0)
            .collect();
        TableNames { names }
    }

    #[inline]
    pub fn get(&self, tid: u32) -> Option<&Comm> {
        self.names.get(&tid)
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// Interrupt names from `lttng_statedump_interrupt`: each irq's distinct
/// action names, joined by "," in the order first seen (a shared line has
/// several handlers; the wire does not say which one ran).
#[derive(Debug, Default)]
pub struct IrqNames {
    names: HashMap<u32, Vec<u8>>,
    /// Interrupts not kept because the table was full.
    pub dropped: u64,
}

impl IrqNames {
    /// Interrupt `irq` has a handler called `action` (guest text).
    pub fn add(&mut self, irq: u32, action: &[u8]) {
        let mut clean = Vec::with_capacity(action.len().min(IRQ_NAME_MAX));
        push_clean(action, &mut clean, IRQ_NAME_MAX);
        if clean.is_empty() {
            return;
        }
        if !self.names.contains_key(&irq) && self.names.len() >= MAX_IRQS {
            self.dropped += 1;
            return;
        }
        let name = self.names.entry(irq).or_default();
        let known = name.split(|&b| b == b',').any(|part| part == clean);
        if known {
            return;
        }
        if name.is_empty() {
            name.extend_from_slice(&clean);
        } else if name.len() + 1 + clean.len() <= IRQ_NAME_MAX {
            name.push(b',');
            name.extend_from_slice(&clean);
        }
    }

    /// The name of `irq`: empty if the state dump never named it.
    #[inline]
    pub fn get(&self, irq: u32) -> &[u8] {
        self.names.get(&irq).map_or(&[], Vec::as_slice)
    }

    /// Interrupts with a name.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comm(s: &str) -> Comm {
        sanitize_comm(s.as_bytes())
    }

    fn text(c: &Comm) -> &str {
        let n = c.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
        std::str::from_utf8(&c[..n]).unwrap()
    }

    #[test]
    fn hostile_names_are_sanitized() {
        assert_eq!(text(&comm("bash")), "bash");
        assert_eq!(text(&sanitize_comm(b"a\"b\\c\n\x1b[31m")), "a?b?c??[31m");
        assert_eq!(text(&sanitize_comm(b"ok\xff\xfe!")), "ok??!");
        // 16 bytes without a NUL: cut to 15, always NUL-terminated
        let c = sanitize_comm(b"0123456789abcdefXYZ");
        assert_eq!(text(&c), "0123456789abcde");
        assert_eq!(c[15], 0);
        // garbage after the NUL never survives
        assert_eq!(sanitize_comm(b"ab\0GARBAGE"), comm("ab"));
        // a multi-byte character straddling byte 15 is left out whole
        let c = sanitize_comm("abcdefghijklmn\u{e9}".as_bytes());
        assert_eq!(text(&c), "abcdefghijklmn");
        assert_eq!(text(&comm("caf\u{e9}")), "caf\u{e9}");
    }

    #[test]
    fn swapper_names_the_cpu() {
        assert_eq!(text(&swapper(0)), "swapper/0");
        assert_eq!(text(&swapper(4_000_000_000)), "swapper/4000000");
    }

    #[test]
    fn lookups_take_the_latest_name_at_or_before_else_the_earliest_later() {
        let mut b = ThreadNamesBuilder::default();
        b.add(7, 100, comm("sh"));
        b.add(7, 200, comm("sh")); // repeated: not kept
        b.add(7, 300, comm("ls"));
        b.add(9, 250, comm("late"));
        assert_eq!(b.repeated, 1);
        let n = b.build();
        assert_eq!(n.entries(), 3);
        assert_eq!(n.threads(), 2);
        assert_eq!(n.lookup(7, 99), Name::Later(&comm("sh")));
        assert_eq!(n.lookup(7, 100), Name::AtOrBefore(&comm("sh")));
        assert_eq!(n.lookup(7, 299), Name::AtOrBefore(&comm("sh")));
        assert_eq!(n.lookup(7, 300), Name::AtOrBefore(&comm("ls")));
        assert_eq!(n.lookup(7, u64::MAX), Name::AtOrBefore(&comm("ls")));
        assert_eq!(n.lookup(9, 0), Name::Later(&comm("late")));
        assert_eq!(n.lookup(9, 250), Name::AtOrBefore(&comm("late")));
        assert_eq!(n.lookup(8, 250), Name::Unknown);
    }

    #[test]
    fn a_name_change_back_is_kept() {
        let mut b = ThreadNamesBuilder::default();
        b.add(1, 10, comm("a"));
        b.add(1, 20, comm("b"));
        b.add(1, 30, comm("a"));
        let n = b.build();
        assert_eq!(n.lookup(1, 35), Name::AtOrBefore(&comm("a")));
        assert_eq!(n.lookup(1, 25), Name::AtOrBefore(&comm("b")));
    }

    #[test]
    fn the_table_is_bounded() {
        let mut b = ThreadNamesBuilder::with_limit(1000);
        for tid in 0..100_000u32 {
            b.add(tid, tid as u64, comm("x"));
        }
        assert_eq!(b.dropped, 99_000);
        let n = b.build();
        assert_eq!(n.entries(), 1000);
        assert_eq!(n.lookup(999, 5000), Name::AtOrBefore(&comm("x")));
        assert_eq!(n.lookup(1000, 5000), Name::Unknown);
    }

    #[test]
    fn irq_names_join_distinct_actions() {
        let mut irqs = IrqNames::default();
        irqs.add(11, b"virtio0");
        irqs.add(11, b"ehci_hcd:usb1");
        irqs.add(11, b"virtio0");
        irqs.add(4, b"tty\"S0\n");
        irqs.add(5, b"");
        assert_eq!(irqs.get(11), b"virtio0,ehci_hcd:usb1");
        assert_eq!(irqs.get(4), b"tty?S0?");
        assert_eq!(irqs.get(5), b"");
        assert_eq!(irqs.get(99), b"");
        let long = [b'x'; 400];
        irqs.add(6, &long);
        assert_eq!(irqs.get(6).len(), IRQ_NAME_MAX);
    }
}
