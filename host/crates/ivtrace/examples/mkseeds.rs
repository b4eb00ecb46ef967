//! Writes the committed fuzz seed corpus (host/fuzz/corpus/) from the
//! writer model: small regions (trailing zeros trimmed; the fuzz target
//! zero-extends them) and single packets for the packet target.
//!
//!     cargo run --example mkseeds -- host/fuzz/corpus

use std::path::Path;

use ivtrace_region::abi;
use ivtrace_region::bytes::le_u64;
use ivtrace_testutil::{
    kernel_fuzz_input, kernel_fuzz_region, packet_template, RegionBuilder, TestRegion,
};

fn trim(mut b: Vec<u8>) -> Vec<u8> {
    while b.last() == Some(&0) {
        b.pop();
    }
    b
}

fn region(mode: u32, events: u64, open_tail: bool) -> Vec<u8> {
    let mut r = RegionBuilder::new(2, 2, 4096).mode(mode).build_region();
    r.register_loadgen(0);
    r.register(
        1,
        1,
        "text",
        &[("s", abi::IVT_FT_STRING, 0), ("c", abi::IVT_FT_CHARS, 8)],
    );
    r.register(1, 40, "ext", &[("x", abi::IVT_FT_U16, 0)]);
    for i in 0..events {
        let c = (i % 2) as u32;
        let ts = 1000 + i * if i % 5 == 0 { 1 << 28 } else { 300 };
        match i % 4 {
            0 => r.emit(c, ts, 1, &[&b"msg\xff\0"[..], b"comm\0\0\0\0"].concat()),
            1 => r.emit(c, ts, 40, &7u16.to_le_bytes()),
            _ => r.emit(
                c,
                ts,
                0,
                &TestRegion::loadgen_payload(c as u16, i, &vec![3; (i % 9) as usize]),
            ),
        };
    }
    if !open_tail {
        r.close(0);
        r.close(1);
        r.close_region();
    }
    trim(r.bytes)
}

fn packets() -> Vec<Vec<u8>> {
    let mut r = packet_template();
    for i in 0..60u64 {
        let ts = 500 + i * if i % 7 == 0 { 1 << 27 } else { 90 };
        match i % 4 {
            0 => r.emit(0, ts, 1, b"hello\0abcdefgh"),
            1 => r.emit(0, ts, 2, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]),
            2 => r.emit(0, ts, 40, &9u16.to_le_bytes()),
            _ => r.emit(0, ts, 0, &TestRegion::loadgen_payload(0, i, &[5; 6])),
        };
    }
    r.close(0);
    let at = r.subbuf_offset(0, 0);
    let full = r.bytes[at..at + 4096].to_vec();
    let content = le_u64(&full, abi::pkt::CONTENT_SIZE) as usize / 8;
    vec![
        full[..content].to_vec(),
        full[..content / 2].to_vec(),
        full[..abi::PACKET_HDR_SIZE + 4].to_vec(),
    ]
}

/// Field bytes in the kernel fuzz input's form (testutil's
/// `kernel_fuzz_region`).
#[derive(Default)]
struct Fields(Vec<u8>);

impl Fields {
    fn u(mut self, v: u64, width: usize) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes()[..width]);
        self
    }
    /// Integers of `width` bytes each.
    fn us(mut self, values: &[u64], width: usize) -> Self {
        for &v in values {
            self = self.u(v, width);
        }
        self
    }
    fn comm(mut self, name: &str) -> Self {
        let mut c = [0u8; 16];
        c[..name.len().min(15)].copy_from_slice(&name.as_bytes()[..name.len().min(15)]);
        self.0.extend_from_slice(&c);
        self
    }
    /// A string or byte field: a length byte, then the bytes.
    fn text(self, s: &str) -> Self {
        self.bytes(s.as_bytes())
    }
    fn bytes(mut self, b: &[u8]) -> Self {
        self.0.push(b.len() as u8);
        self.0.extend_from_slice(b);
        self
    }
}

type Event = (u8, u8, u8, Vec<u8>);

/// `KERNEL_EVENTS` ids (testutil) used below.
mod id {
    pub const SWITCH: u8 = 0;
    pub const WAKEUP: u8 = 1;
    pub const IRQ_ENTRY: u8 = 2;
    pub const IRQ_EXIT: u8 = 3;
    pub const HRTIMER_ENTRY: u8 = 6;
    pub const KMALLOC: u8 = 8;
    pub const SYSCALL_ENTRY: u8 = 12;
    pub const SYSCALL_EXIT: u8 = 13;
    pub const PRINTK: u8 = 14;
    pub const FORK: u8 = 16;
    pub const EXEC: u8 = 17;
    pub const EXIT: u8 = 18;
    pub const RENAME: u8 = 20;
    pub const DUMP_START: u8 = 21;
    pub const DUMP_END: u8 = 22;
    pub const DUMP_PROCESS: u8 = 23;
    pub const DUMP_INTERRUPT: u8 = 24;
    pub const DOORBELL: u8 = 25;
    pub const LOCAL_TIMER_ENTRY: u8 = 28;
    pub const LOCAL_TIMER_EXIT: u8 = 29;
}

/// The initial pid namespace's inode number.
const INIT_NS: u64 = 0xEFFF_FFFC;

fn switch(prev: u64, next: u64) -> Vec<u8> {
    let f = Fields::default();
    f.u(prev, 4).u(20, 1).u(1, 2).u(next, 4).u(20, 1).0
}

fn u64s(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The state dump: two threads and an interrupt.
fn statedump() -> Vec<Event> {
    let f = Fields::default;
    let dump = |tid: u64, name: &str| {
        let head = f().us(&[tid, tid, tid, tid, 0, 0], 4).comm(name);
        head.us(&[0, 0, 0, 1, 0, INIT_NS, 0], 4).0
    };
    let irq = f().u(11, 4).text("eth0").text("virtio0-input.0").0;
    vec![
        (0, id::DUMP_START, 1, vec![]),
        (0, id::DUMP_PROCESS, 1, dump(1, "init")),
        (0, id::DUMP_PROCESS, 1, dump(7, "sshd")),
        (0, id::DUMP_INTERRUPT, 1, irq),
        (0, id::DUMP_END, 1, vec![]),
    ]
}

/// System calls: write (named, integers only), openat (named, a string
/// argument) and a number the table does not name, each with its exit.
fn syscalls() -> Vec<Event> {
    let f = Fields::default;
    let entry =
        |nr: u64, args: &[u64], strings: &[u8]| f().u(nr, 2).bytes(&u64s(args)).bytes(strings).0;
    let exit = |nr: u64, ret: u64| f().u(nr, 2).u(ret, 8).bytes(&[]).bytes(&[]).0;
    vec![
        (0, id::SYSCALL_ENTRY, 1, entry(1, &[1, 0x1000, 5], b"")),
        (0, id::SYSCALL_EXIT, 1, exit(1, 5)),
        (
            0,
            id::SYSCALL_ENTRY,
            1,
            entry(257, &[100, 0x2000, 0, 0], b"/etc/passwd\0"),
        ),
        (0, id::SYSCALL_EXIT, 1, exit(257, 3)),
        (0, id::SYSCALL_ENTRY, 1, entry(999, &[0; 6], b"")),
        (0, id::SYSCALL_EXIT, 1, exit(999, u64::MAX)),
    ]
}

/// A guest's kernel stream in miniature: the state dump, a fork, an
/// exec, a rename, switches and wakeups across CPUs, system calls (one
/// the table does not name), interrupts, a timer, an allocation, a
/// doorbell, a console line, an exit.
fn kernel_events() -> Vec<Event> {
    let f = Fields::default;
    let fork = f().us(&[7, 7, INIT_NS], 4).comm("sshd").u(42, 4);
    let fork = fork.bytes(&42u32.to_le_bytes()).us(&[42, INIT_NS], 4).0;
    let exec = f().text("/bin/ls").us(&[42, 42], 4).comm("ls").0;
    let timer = f()
        .us(&[0xffff_8880_0000_1000, 123456, 0xffff_ffff_8100_0000], 8)
        .0;
    let kmalloc = f().us(&[0xffff_ffff_8120_0000, 0xffff_8880_0000_2000], 8);
    let mut ev = statedump();
    ev.extend([
        (1, id::FORK, 3, fork),
        (0, id::SWITCH, 2, switch(0, 42)),
        (0, id::EXEC, 5, exec),
        (1, id::WAKEUP, 1, f().u(7, 4).u(20, 1).u(1, 2).0),
    ]);
    ev.extend(syscalls());
    ev.extend([
        (1, id::IRQ_ENTRY, 1, f().u(11, 4).0),
        (1, id::IRQ_EXIT, 1, f().us(&[11, 1], 4).0),
        (0, id::LOCAL_TIMER_ENTRY, 1, f().u(0xec, 4).0),
        (0, id::LOCAL_TIMER_EXIT, 1, f().u(0xec, 4).0),
        (0, id::HRTIMER_ENTRY, 200, timer),
        (0, id::KMALLOC, 1, kmalloc.us(&[64, 64, 0xcc0], 4).0),
        (0, id::DOORBELL, 1, f().u(1, 8).u(0, 2).0),
        (1, id::RENAME, 1, f().u(7, 4).comm("sshd: root").0),
        (1, id::PRINTK, 1, f().text("eth0: link up").0),
        (0, id::EXIT, 1, f().u(42, 4).u(20, 1).0),
        (0, id::SWITCH, 1, switch(42, 0)),
    ]);
    ev.extend((0..40u8).map(|i| (i % 2, id::SWITCH, 3, switch(0, 7 + (i % 3) as u64))));
    ev
}

fn main() {
    let root = std::env::args().nth(1).expect("usage: mkseeds CORPUS_DIR");
    let root = Path::new(&root);
    let seeds = [
        ("model-discard", region(abi::IVT_MODE_DISCARD, 300, false)),
        (
            "model-overwrite",
            region(abi::IVT_MODE_OVERWRITE, 700, false),
        ),
        ("model-open", region(abi::IVT_MODE_DISCARD, 90, true)),
        ("model-empty", region(abi::IVT_MODE_DISCARD, 0, false)),
    ];
    for (name, bytes) in seeds {
        std::fs::write(root.join("region").join(name), bytes).expect("write seed");
    }
    for (i, p) in packets().into_iter().enumerate() {
        std::fs::write(root.join("packet").join(format!("model-{i}")), p).expect("write seed");
    }
    let kernel = kernel_fuzz_input(2, &kernel_events());
    std::fs::create_dir_all(root.join("kernel")).expect("corpus/kernel");
    std::fs::write(root.join("kernel").join("model-two-cpus"), &kernel).expect("write seed");
    let one_cpu: Vec<_> = kernel_events()
        .into_iter()
        .map(|(_, id, dt, f)| (0, id, dt, f))
        .collect();
    let one = kernel_fuzz_input(1, &one_cpu);
    std::fs::write(root.join("kernel").join("model-one-cpu"), one).expect("write seed");
    // The same stream as a whole region, for the region target.
    let region = trim(kernel_fuzz_region(&kernel));
    std::fs::write(root.join("region").join("model-kernel"), region).expect("write seed");
}
