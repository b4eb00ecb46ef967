//! The vocabulary of a Linux boot: its stages, the initcall levels in the
//! order they run, and which level an initcall belongs to.
//!
//! Linux runs its initcalls by level (init/main.c, include/linux/init.h):
//! `console` (console_init(), in start_kernel), `early`
//! (do_pre_smp_initcalls()), then do_initcalls()'s levels pure, core,
//! postcore, arch, subsys, fs, device, late. Each level's section holds its
//! plain initcalls, then its `_sync` ones; `rootfs` initcalls run inside
//! `fs`, after fs_sync. The `initcall_level` tracepoint names only the
//! levels; an initcall's sub-level is in the name of its entry in the
//! initcall table (`__initcall__kmod_<mod>__<n>_<line>_<fn><id>`, `<id>`
//! one of `con`, `early`, `0`..`7`, `0s`..`7s`, `rootfs`), which the guest's
//! kallsyms lists (kallsyms' `__initcall*` symbols, sent by the relay).

use std::collections::HashMap;

use ivtrace_region::kallsyms::Symbols;

/// Every sub-level, in the order they run, with its level.
pub const SUBLEVELS: &[(&str, &str)] = &[
    ("console", "console"),
    ("early", "early"),
    ("pure", "pure"),
    ("pure_sync", "pure"),
    ("core", "core"),
    ("core_sync", "core"),
    ("postcore", "postcore"),
    ("postcore_sync", "postcore"),
    ("arch", "arch"),
    ("arch_sync", "arch"),
    ("subsys", "subsys"),
    ("subsys_sync", "subsys"),
    ("fs", "fs"),
    ("fs_sync", "fs"),
    ("rootfs", "fs"),
    ("device", "device"),
    ("device_sync", "device"),
    ("late", "late"),
    ("late_sync", "late"),
];

/// do_initcalls()'s level numbers.
const NUMBERED: [&str; 8] = [
    "pure", "core", "postcore", "arch", "subsys", "fs", "device", "late",
];

/// The position of sub-level `name` in [`SUBLEVELS`].
pub fn order(name: &str) -> Option<usize> {
    SUBLEVELS.iter().position(|(s, _)| *s == name)
}

/// The level sub-level `name` is part of (itself for a level).
pub fn level_of(name: &str) -> Option<&'static str> {
    SUBLEVELS.iter().find(|(s, _)| *s == name).map(|(_, l)| *l)
}

/// The canonical name of a level as `initcall_level` gives it (a known
/// level, else None: guest text).
pub fn known_level(name: &str) -> Option<&'static str> {
    SUBLEVELS
        .iter()
        .find(|(s, l)| s == l && *s == name)
        .map(|(s, _)| *s)
}

/// The sub-level an initcall table entry's `<id>` suffix names.
fn sublevel_of_id(id: &str) -> Option<&'static str> {
    let sync = id.strip_suffix('s');
    let digit = sync.unwrap_or(id);
    if let Ok(n) = digit.parse::<usize>() {
        let level = NUMBERED.get(n)?;
        let name = match sync {
            Some(_) => format!("{level}_sync"),
            None => level.to_string(),
        };
        return SUBLEVELS.iter().find(|(s, _)| *s == name).map(|(s, _)| *s);
    }
    match id {
        "con" => Some("console"),
        "early" => Some("early"),
        "rootfs" => Some("rootfs"),
        _ => None,
    }
}

/// The function and sub-level of an initcall table entry's symbol name
/// (`__initcall__kmod_<mod>__<n>_<line>_<fn><id>`, or the older
/// `__initcall_<fn><id>`); None for any other symbol.
pub fn initcall_entry(name: &str) -> Option<(&str, &'static str)> {
    let rest = match name.strip_prefix("__initcall__kmod_") {
        Some(r) => {
            // <mod>__<n>_<line>_<fn><id>: the module name has no "__".
            let after = &r[r.find("__")? + 2..];
            let mut parts = after.splitn(3, '_');
            let (n, line, rest) = (parts.next()?, parts.next()?, parts.next()?);
            if !n.bytes().all(|c| c.is_ascii_digit()) || !line.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            rest
        }
        None => name.strip_prefix("__initcall_")?,
    };
    let id_len = id_suffix_len(rest)?;
    let (func, id) = rest.split_at(rest.len() - id_len);
    if func.is_empty() {
        return None;
    }
    Some((func, sublevel_of_id(id)?))
}

/// How long the `<id>` at the end of `s` is: a digit, a digit and `s`, or
/// one of the named ids.
fn id_suffix_len(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let last = *b.last()?;
    if last.is_ascii_digit() {
        return Some(1);
    }
    if last == b's' && b.len() >= 2 && b[b.len() - 2].is_ascii_digit() {
        return Some(2);
    }
    ["early", "rootfs", "con"]
        .iter()
        .find(|id| s.ends_with(*id))
        .map(|id| id.len())
}

/// Which sub-level each initcall function belongs to, from the initcall
/// table's entries in a symbol table.
#[derive(Debug, Default)]
pub struct InitcallLevels {
    /// Function name -> the sub-levels of the entries naming it (a static
    /// function's name can be an initcall in several files).
    by_func: HashMap<String, Vec<&'static str>>,
}

impl InitcallLevels {
    pub fn new(symbols: &Symbols) -> InitcallLevels {
        let mut by_func: HashMap<String, Vec<&'static str>> = HashMap::new();
        for s in symbols.iter() {
            if let Some((func, sub)) = initcall_entry(&s.name) {
                let v = by_func.entry(func.to_string()).or_default();
                if !v.contains(&sub) {
                    v.push(sub);
                }
            }
        }
        InitcallLevels { by_func }
    }

    pub fn is_empty(&self) -> bool {
        self.by_func.is_empty()
    }

    /// The sub-level of initcall `func` while the kernel runs `level`: the
    /// one its entry names, or, of several, the one in `level`; None when
    /// unknown or ambiguous.
    pub fn sublevel(&self, func: &str, level: Option<&str>) -> Option<&'static str> {
        let subs = self.by_func.get(func)?;
        if let [one] = subs.as_slice() {
            return Some(one);
        }
        let level = level?;
        let mut within = subs.iter().filter(|s| level_of(s) == Some(level));
        match (within.next(), within.next()) {
            (Some(s), None) => Some(s),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_give_function_and_sublevel() {
        for (name, want) in [
            (
                "__initcall__kmod_core__391_2229_init_hw_perf_eventsearly",
                ("init_hw_perf_events", "early"),
            ),
            (
                "__initcall__kmod_vt__420_3516_con_initcon",
                ("con_init", "console"),
            ),
            (
                "__initcall__kmod_foo__1_2_foo_init16",
                ("foo_init1", "device"),
            ),
            ("__initcall__kmod_foo__1_2_bars4s", ("bars", "subsys_sync")),
            (
                "__initcall__kmod_foo__1_2_foo_initrootfs",
                ("foo_init", "rootfs"),
            ),
            ("__initcall__kmod_x_y__1_2_f1s", ("f", "core_sync")),
            (
                "__initcall_populate_rootfsrootfs",
                ("populate_rootfs", "rootfs"),
            ),
        ] {
            assert_eq!(initcall_entry(name), Some(want), "{name}");
        }
        for not in [
            "__initcall_start",
            "__initcall0_start",
            "__initcall_end",
            "do_one_initcall",
            "__initcall__kmod_core__x_1_f6",
            "__initcall__kmod_core__1_2_f9",
            "__initcall__kmod_core__1_2_6",
        ] {
            assert_eq!(initcall_entry(not), None, "{not}");
        }
    }

    #[test]
    fn ambiguous_functions_resolve_within_the_running_level() {
        let syms = Symbols::parse(
            b"ffffffff81000000 d __initcall__kmod_a__1_2_init4\n\
              ffffffff81000004 d __initcall__kmod_b__3_4_init6\n\
              ffffffff81000008 d __initcall__kmod_c__5_6_only6s\n",
        );
        let l = InitcallLevels::new(&syms);
        assert_eq!(l.sublevel("only", None), Some("device_sync"));
        assert_eq!(l.sublevel("init", Some("device")), Some("device"));
        assert_eq!(l.sublevel("init", Some("subsys")), Some("subsys"));
        assert_eq!(l.sublevel("init", None), None);
        assert_eq!(l.sublevel("init", Some("late")), None);
    }

    #[test]
    fn sublevels_run_in_order() {
        assert!(order("fs_sync") < order("rootfs") && order("rootfs") < order("device"));
        assert_eq!(level_of("rootfs"), Some("fs"));
        assert_eq!(known_level("core"), Some("core"));
        assert_eq!(known_level("core_sync"), None);
        assert_eq!(known_level("\u{1b}[2J"), None);
    }
}
