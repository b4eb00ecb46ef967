//! The kernel stream end to end through the CLI: a region with the guest
//! module's events (ring's writer model) -> `ivtrace record` / `snapshot`
//! -> an LTTng-style kernel trace that `ivtrace report` and babeltrace2
//! read by LTTng event names.

mod common;

use std::path::Path;
use std::process::Command;

use common::{ivtrace_shm, report_json, run};
use ivtrace_testutil::{have_tool, RegionBuilder, TestRegion};

fn u32s(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Two CPUs: a fork on CPU 1, switches to the child on CPU 0, syscalls.
fn kernel_region() -> TestRegion {
    let mut r = RegionBuilder::new(3, 4, 4096).kernel(2).build_region();
    r.register_kernel_events();
    let mut fork = u32s(&[1, 1, 0xEFFF_FFFC]);
    fork.extend_from_slice(b"e2e-kid\0\0\0\0\0\0\0\0\0");
    fork.extend_from_slice(&u32s(&[42, 4, 42, 42, 0xEFFF_FFFC])); // child_tid, vtids [42], ...
    r.emit(1, 100, 16, &fork);
    let switch = |prev: u32, next: u32| {
        let mut p = prev.to_le_bytes().to_vec();
        p.extend_from_slice(&[20, 0, 0]);
        p.extend_from_slice(&next.to_le_bytes());
        p.push(20);
        p
    };
    r.emit(0, 200, 0, &switch(0, 42));
    r.emit(0, 300, 0, &switch(42, 0));
    for i in 0..5u64 {
        // write(1, 0x1000, 5): its three arguments, no user string
        let mut entry = 1u16.to_le_bytes().to_vec();
        entry.extend_from_slice(&24u32.to_le_bytes());
        for a in [1u64, 0x1000, 5] {
            entry.extend_from_slice(&a.to_le_bytes());
        }
        entry.extend_from_slice(&0u32.to_le_bytes());
        r.emit(0, 400 + 10 * i, 12, &entry);
        let mut exit = 1u16.to_le_bytes().to_vec();
        exit.extend_from_slice(&5i64.to_le_bytes());
        exit.extend_from_slice(&[0; 8]); // no out-arguments, no data
        r.emit(0, 405 + 10 * i, 13, &exit);
    }
    r.close(0);
    r.close(1);
    r.close_region();
    r
}

fn write_region(dir: &Path, r: &TestRegion) -> std::path::PathBuf {
    let shm = dir.join("guest7.shm");
    std::fs::write(&shm, &r.bytes).unwrap();
    shm
}

fn report_counts(dir: &Path) -> serde_json::Value {
    let r = report_json(dir);
    let mut counts = serde_json::Map::new();
    for e in r["event_types"].as_array().unwrap() {
        if e["stream_class"] == 0 {
            counts.insert(e["name"].as_str().unwrap().into(), e["count"].clone());
        }
    }
    counts.into()
}

#[test]
fn snapshot_and_record_write_an_lttng_kernel_trace_report_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let shm = write_region(tmp.path(), &kernel_region());
    for cmd in ["snapshot", "record"] {
        let out_dir = tmp.path().join(cmd);
        let out = run(&mut ivtrace_shm(&[cmd], &shm, &out_dir));
        assert!(out.status.success());
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("kernel stream expanded to LTTng's layout: 13 events"),
            "{stdout}"
        );
        assert!(!out_dir.join(".kernel-wire").exists());
        let counts = report_counts(&out_dir);
        assert_eq!(counts["sched_switch"], 2, "{counts}");
        assert_eq!(counts["sched_process_fork"], 1);
        assert_eq!(counts["syscall_entry_write"], 5);
        assert_eq!(counts["syscall_exit_write"], 5);
        assert!(counts.get("syscall_entry").is_none());
        let meta = std::fs::read_to_string(out_dir.join("kernel/metadata")).unwrap();
        assert!(
            meta.contains("hostname = \"guest7\";"),
            "the region file's stem"
        );
        assert!(meta.contains("tracer_name = \"lttng-modules\";"));
        let side: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out_dir.join("ivtrace.json")).unwrap()).unwrap();
        assert_eq!(side["kernel_expansion"]["threads"], 1); // the child
        assert_eq!(side["kernel_expansion"]["syscall_classes"], 2);
    }
}

#[test]
fn name_option_sets_the_hostname_and_babeltrace2_shows_the_names() {
    let tmp = tempfile::tempdir().unwrap();
    let shm = write_region(tmp.path(), &kernel_region());
    let out_dir = tmp.path().join("out");
    let out = run(&mut ivtrace_shm(
        &["snapshot", "--name", "vm \"one\""],
        &shm,
        &out_dir,
    ));
    assert!(out.status.success());
    let meta = std::fs::read_to_string(out_dir.join("kernel/metadata")).unwrap();
    assert!(
        meta.contains("hostname = \"vm__one_\";"),
        "sanitized --name"
    );
    if !have_tool("babeltrace2") {
        eprintln!("SKIP babeltrace2 check: not installed");
        return;
    }
    let out = run(Command::new("babeltrace2").arg(&out_dir));
    assert!(out.status.success());
    assert!(out.stderr.is_empty());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("prev_comm = \"swapper/0\", prev_tid = 0, prev_prio = 20, prev_state = 0, next_comm = \"e2e-kid\", next_tid = 42"),
        "{text}"
    );
    assert!(text.contains("vm__one_ syscall_entry_write:"), "{text}");
}

mod hostile {
    use proptest::prelude::*;

    use ivtrace_testutil::RegionBuilder;

    /// syscall_entry: any number, 0..6 arguments, any string bytes.
    fn syscall_entry(
        text: impl Strategy<Value = Vec<u8>>,
    ) -> impl Strategy<Value = (u32, Vec<u8>)> {
        let nr = prop_oneof![0u16..460, any::<u16>()];
        (nr, 0usize..7, any::<[u8; 48]>(), text).prop_map(|(n, k, a, st)| {
            let mut p = n.to_le_bytes().to_vec();
            p.extend_from_slice(&(8 * k as u32).to_le_bytes());
            p.extend_from_slice(&a[..8 * k]);
            p.extend_from_slice(&(st.len() as u32).to_le_bytes());
            p.extend_from_slice(&st);
            (12, p)
        })
    }

    /// syscall_exit: any number, 0..6 out-arguments, 0 or 8 data bytes.
    fn syscall_exit() -> impl Strategy<Value = (u32, Vec<u8>)> {
        let nr = prop_oneof![0u16..460, any::<u16>()];
        (nr, any::<i64>(), 0usize..7, any::<bool>()).prop_map(|(n, r, k, data)| {
            let mut p = n.to_le_bytes().to_vec();
            p.extend_from_slice(&r.to_le_bytes());
            p.extend_from_slice(&(8 * k as u32).to_le_bytes());
            p.extend(std::iter::repeat_n(7u8, 8 * k));
            let d = if data { 8 } else { 0 };
            p.extend_from_slice(&(d as u32).to_le_bytes());
            p.extend(std::iter::repeat_n(3u8, d));
            (13, p)
        })
    }

    /// sched_process_fork: any tids, name and pid namespace, a vtids field
    /// of any byte count (whole s32 values or not).
    fn fork(
        tid: impl Strategy<Value = u32> + Clone,
        name: impl Strategy<Value = Vec<u8>>,
    ) -> impl Strategy<Value = (u32, Vec<u8>)> {
        (tid.clone(), tid, name, any::<u32>(), 0usize..12).prop_map(|(a, b, n, ns, v)| {
            let mut p = a.to_le_bytes().to_vec();
            p.extend_from_slice(&a.to_le_bytes());
            p.extend_from_slice(&ns.to_le_bytes());
            p.extend_from_slice(&n);
            p.extend_from_slice(&b.to_le_bytes());
            p.extend_from_slice(&(v as u32).to_le_bytes());
            p.extend(std::iter::repeat_n(9u8, v));
            p.extend_from_slice(&b.to_le_bytes());
            p.extend_from_slice(&ns.to_le_bytes());
            (16, p)
        })
    }

    /// One kernel event with hostile content: any tid, any name bytes,
    /// any syscall number or irq (valid framing: the writer model frames it).
    fn event() -> impl Strategy<Value = (u32, u32, Vec<u8>)> {
        let tid = prop_oneof![0u32..8, any::<u32>()];
        let name = proptest::collection::vec(any::<u8>(), 16);
        let text = proptest::collection::vec(1u8..=255, 0..40);
        (
            0u32..2,
            prop_oneof![
                (tid.clone(), tid.clone(), any::<u16>()).prop_map(|(a, b, s)| {
                    let mut p = a.to_le_bytes().to_vec();
                    p.push(20);
                    p.extend_from_slice(&s.to_le_bytes());
                    p.extend_from_slice(&b.to_le_bytes());
                    p.push(0x80);
                    (0, p)
                }),
                (tid.clone(), any::<u16>()).prop_map(|(t, c)| {
                    let mut p = t.to_le_bytes().to_vec();
                    p.push(1);
                    p.extend_from_slice(&c.to_le_bytes());
                    (1, p)
                }),
                any::<u32>().prop_map(|irq| (2, irq.to_le_bytes().to_vec())),
                syscall_entry(text.clone()),
                syscall_exit(),
                fork(tid.clone(), name.clone()),
                (tid.clone(), text.clone(), name.clone()).prop_map(|(t, f, n)| {
                    let mut p = f;
                    p.push(0);
                    p.extend_from_slice(&t.to_le_bytes());
                    p.extend_from_slice(&t.to_le_bytes());
                    p.extend_from_slice(&n);
                    (17, p)
                }),
                (tid.clone(), name.clone()).prop_map(|(t, n)| {
                    let mut p = t.to_le_bytes().to_vec();
                    p.extend_from_slice(&n);
                    (20, p)
                }),
                (tid, name).prop_map(|(t, n)| {
                    let mut p = [t, t, t, t, 1, 1]
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect::<Vec<_>>();
                    p.extend_from_slice(&n);
                    p.extend_from_slice(&[0u8; 28]);
                    (23, p)
                }),
                (any::<u32>(), text.clone(), text).prop_map(|(irq, a, b)| {
                    let mut p = irq.to_le_bytes().to_vec();
                    p.extend_from_slice(&a);
                    p.push(0);
                    p.extend_from_slice(&b);
                    p.push(0);
                    (24, p)
                }),
            ],
        )
            .prop_map(|(c, (id, p))| (c, id, p))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Whatever the guest's naming events say, the expansion neither
        /// panics nor loses an event, and `report` reads the result.
        #[test]
        fn hostile_kernel_events_expand_and_report(
            events in proptest::collection::vec(super::hostile::event(), 1..300),
        ) {
            let mut r = RegionBuilder::new(2, 8, 4096).kernel(2).build_region();
            r.register_kernel_events();
            let mut emitted = 0u64;
            for (i, (c, id, p)) in events.iter().enumerate() {
                emitted += r.emit(*c, 1000 + 37 * i as u64, *id, p) as u64;
            }
            r.close_region();
            let dir = tempfile::tempdir().unwrap();
            let n = ivtrace_engine::session::drain_bytes_to_dir(&r.bytes, dir.path()).unwrap();
            prop_assert_eq!(n, emitted);
            let rep = ivtrace::report::build(dir.path()).unwrap();
            prop_assert_eq!(rep.events, emitted);
            for e in rep.event_types.iter().filter(|e| e.count > 0) {
                prop_assert!(
                    !matches!(e.name.as_str(), "syscall_entry" | "syscall_exit"),
                    "wire syscall class left: {}", e.name
                );
            }
            prop_assert!(!dir.path().join(".kernel-wire").exists());
        }
    }
}

/// The committed seeds of the `kernel` fuzz target reach the expansion:
/// thread names resolved across CPUs, irq names, per-syscall classes.
#[test]
fn the_kernel_fuzz_seed_reaches_the_expansion() {
    let seed = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/corpus/kernel/model-two-cpus"
    ))
    .unwrap();
    let region = ivtrace_testutil::kernel_fuzz_region(&seed);
    let dir = tempfile::tempdir().unwrap();
    ivtrace_engine::session::drain_bytes_to_dir(&region, dir.path()).unwrap();
    let side: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("ivtrace.json")).unwrap()).unwrap();
    let x = &side["kernel_expansion"];
    assert!(x["events"].as_u64().unwrap() > 50, "{x}");
    assert!(x["threads"].as_u64().unwrap() >= 3, "{x}");
    assert_eq!(x["irqs_named"], 1);
    assert!(x["syscalls_named"].as_u64().unwrap() >= 2, "{x}");
    assert!(dir.path().join("kernel/metadata").exists());
    let counts = report_counts(dir.path());
    assert!(
        counts["syscall_entry_write"].as_u64().unwrap() >= 1,
        "{counts}"
    );
}
