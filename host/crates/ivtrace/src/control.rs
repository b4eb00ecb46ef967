//! The host's words in the region header (abi.h lines 4-8): the doorbell
//! target and `host_sleeping`, the control mailbox (`struct ivt_control`)
//! and the clock sync mailbox (`struct ivt_sync`), plus posting a control
//! command and waiting for the writer's acknowledgement.
//!
//! Protocol (docs/abi.md "Host control, notification and time"): the host
//! writes `cmd` and `arg`, store-releases `cmd_seq = previous + 1` and
//! kicks the writer (MSI-X vector 0 of an ivshmem-doorbell device; an
//! ivshmem-plain guest polls every `flush_interval_ms`). The writer acts,
//! writes `ack_status` and `groups_enabled`, store-releases `ack_seq`. One
//! host controller at a time: callers hold an exclusive `flock` on the
//! region file while they post and wait, so `ivtrace serve` and
//! `ivtrace ctl --shm` never interleave their commands.

use std::fs::File;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};

use ivtrace_region::Region;

/// Byte offsets of the host's words in `struct ivt_region_hdr` (checked
/// against `abi/vectors.json` by a test, like ivtrace-region's mirror).
pub mod off {
    /// `doorbells`: doorbells rung by writers (statistics, fetch-add).
    pub const DOORBELLS: u64 = 216;
    /// `host_sleeping` (u32).
    pub const HOST_SLEEPING: u64 = 256;
    /// `host_peer_id` (u16) followed by `host_vector` (u16): stored as one u32.
    pub const HOST_PEER_ID: u64 = 260;
    pub const HOST_VECTOR: u64 = 262;
    /// `flush_interval_ms` (u32), written by the formatter.
    pub const FLUSH_INTERVAL_MS: u64 = 272;
    /// `struct ivt_control`.
    pub const CONTROL: u64 = 320;
    pub const CMD_SEQ: u64 = CONTROL;
    pub const CMD: u64 = CONTROL + 8;
    pub const ARG: u64 = CONTROL + 16;
    pub const ACK_SEQ: u64 = CONTROL + 64;
    pub const ACK_STATUS: u64 = CONTROL + 72;
    pub const GROUPS_ENABLED: u64 = CONTROL + 76;
    /// `struct ivt_sync`.
    pub const SYNC: u64 = 448;
    pub const REQ_SEQ: u64 = SYNC;
    pub const HOST_T1: u64 = SYNC + 8;
    pub const RESP_SEQ: u64 = SYNC + 64;
    pub const RESP_T2: u64 = SYNC + 72;
    pub const RESP_T3: u64 = SYNC + 80;
}

/// Feature bits beyond ivtrace-region's mirror (abi.h `IVT_FEAT_*`).
pub const IVT_FEAT_DOORBELL: u64 = 1 << 2;
pub const IVT_FEAT_CONTROL: u64 = 1 << 3;
pub const IVT_FEAT_SYNC: u64 = 1 << 4;

/// Event groups: bit n of the enable/disable argument (ivtrace_kapi.h).
pub const GROUPS: [&str; 6] = ["sched", "irq", "timer", "kmem", "syscall", "printk"];

/// A control command (abi.h `IVT_CMD_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Close every open packet now.
    Flush,
    /// Enable these event groups (mask).
    Enable(u32),
    /// Disable these event groups (mask).
    Disable(u32),
    /// Set every channel's mode (`IVT_MODE_*`), taken at the next packet.
    SetMode(u32),
    /// Re-emit thread and interrupt names.
    Statedump,
}

impl Command {
    pub fn code(self) -> u32 {
        match self {
            Command::Flush => 1,
            Command::Enable(_) => 2,
            Command::Disable(_) => 3,
            Command::SetMode(_) => 4,
            Command::Statedump => 6,
        }
    }

    pub fn arg(self) -> u64 {
        match self {
            Command::Enable(m) | Command::Disable(m) => m as u64,
            Command::SetMode(m) => m as u64,
            _ => 0,
        }
    }

    /// Parses `flush`, `enable GROUPS`, `disable GROUPS`,
    /// `mode discard|overwrite`, `statedump`.
    pub fn parse(words: &[String]) -> Result<Command> {
        let (verb, rest) = words
            .split_first()
            .context("no command (flush, enable, disable, mode, statedump)")?;
        let one = |what: &str| -> Result<&String> {
            match rest {
                [x] => Ok(x),
                _ => bail!("`{verb}` takes exactly one argument: {what}"),
            }
        };
        let none = || -> Result<()> {
            if rest.is_empty() {
                Ok(())
            } else {
                bail!("`{verb}` takes no argument")
            }
        };
        Ok(match verb.as_str() {
            "flush" => {
                none()?;
                Command::Flush
            }
            "statedump" => {
                none()?;
                Command::Statedump
            }
            "enable" => Command::Enable(parse_groups(one("GROUPS, e.g. sched,irq or all")?)?),
            "disable" => Command::Disable(parse_groups(one("GROUPS, e.g. syscall or all")?)?),
            "mode" => Command::SetMode(match one("discard or overwrite")?.as_str() {
                "discard" => ivtrace_region::abi::IVT_MODE_DISCARD,
                "overwrite" => ivtrace_region::abi::IVT_MODE_OVERWRITE,
                m => bail!("unknown mode `{m}` (discard or overwrite)"),
            }),
            v => bail!("unknown command `{v}` (flush, enable, disable, mode, statedump)"),
        })
    }
}

/// `sched,irq` or `all` -> a group mask.
pub fn parse_groups(s: &str) -> Result<u32> {
    let mut mask = 0u32;
    for g in s.split(',').map(str::trim).filter(|g| !g.is_empty()) {
        if g == "all" {
            mask |= (1 << GROUPS.len()) - 1;
            continue;
        }
        match GROUPS.iter().position(|&n| n == g) {
            Some(i) => mask |= 1 << i,
            None => bail!(
                "unknown event group `{g}` (known: {}, all)",
                GROUPS.join(", ")
            ),
        }
    }
    if mask == 0 {
        bail!("no event group given (known: {}, all)", GROUPS.join(", "));
    }
    Ok(mask)
}

/// Names of the groups in `mask` (unknown bits as `bitN`).
pub fn group_names(mask: u32) -> Vec<String> {
    (0..32)
        .filter(|b| mask & (1 << b) != 0)
        .map(|b| {
            GROUPS
                .get(b)
                .map_or_else(|| format!("bit{b}"), |n| n.to_string())
        })
        .collect()
}

/// The writer's answer to one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    pub seq: u64,
    /// 0 or -errno (e.g. -22 for an unknown command or group).
    pub status: i32,
    pub groups_enabled: u32,
    /// From posting the command to seeing the acknowledgement.
    pub latency: Duration,
}

/// Stores the doorbell target (`host_peer_id`, `host_vector`): one u32
/// store of the two adjacent u16 words. Relaxed: the writer reads them
/// with READ_ONCE when it rings, after it has seen `host_sleeping` set,
/// and this store precedes the host's first store of `host_sleeping`
/// (and its full fence) in program order.
pub fn set_doorbell_target(region: &Region, peer: u16, vector: u16) {
    region.store_relaxed_u32(off::HOST_PEER_ID, peer as u32 | (vector as u32) << 16);
}

/// Posts `cmd`; returns its sequence number. The caller holds the lock.
fn post(region: &Region, cmd: Command) -> u64 {
    // Relaxed: cmd_seq is host-owned; we are the only host writing it
    // (flock), so its last value is ours or an earlier controller's.
    let seq = region.load_relaxed_u64(off::CMD_SEQ).wrapping_add(1).max(1);
    region.store_relaxed_u32(off::CMD, cmd.code());
    region.store_relaxed_u64(off::ARG, cmd.arg());
    // Publishes cmd and arg: pairs with the writer's load-acquire of
    // cmd_seq in ivtk_ctl_poll() (guest/kmod/ivtk_ctl.c).
    region.store_release_u64(off::CMD_SEQ, seq);
    seq
}

/// The acknowledgement of `seq`, if the writer has given it.
fn poll_ack(region: &Region, seq: u64) -> Option<(i32, u32)> {
    // Pairs with the writer's store-release of ack_seq, after which its
    // ack_status and groups_enabled stores are visible.
    if region.load_acquire_u64(off::ACK_SEQ) != seq {
        return None;
    }
    let status = region.load_relaxed_u32(off::ACK_STATUS) as i32;
    let groups = region.load_relaxed_u32(off::GROUPS_ENABLED);
    Some((status, groups))
}

/// How long to wait for an acknowledgement: a kicked writer answers in
/// microseconds to milliseconds; a polling one within its flush interval.
pub fn ack_timeout(region: &Region, kicked: bool) -> Duration {
    // Relaxed: a formatter-written parameter, read as a hint only.
    let flush_ms = region.load_relaxed_u32(off::FLUSH_INTERVAL_MS).min(60_000) as u64;
    let poll = Duration::from_millis(if flush_ms == 0 { 100 } else { flush_ms });
    if kicked {
        Duration::from_secs(2).max(poll * 3)
    } else {
        Duration::from_secs(1) + poll * 3
    }
}

/// Posts `cmd` under an exclusive lock of `lock_file` (the region file),
/// calls `kick` (wake the writer; may do nothing), and waits up to
/// `timeout` for the acknowledgement.
pub fn send(
    region: &Region,
    lock_file: &File,
    cmd: Command,
    kick: &dyn Fn(),
    timeout: Duration,
) -> Result<Ack> {
    if region.header().features & IVT_FEAT_CONTROL == 0 {
        bail!(
            "this region's writer does not obey control commands (no IVT_FEAT_CONTROL: \
             libivtrace regions have none; the guest module has)"
        );
    }
    let dup = lock_file
        .try_clone()
        .context("cannot duplicate the region file")?;
    let _lock = Flock::lock(dup, FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .context("cannot lock the region file for a control command")?;
    let t0 = Instant::now();
    let seq = post(region, cmd);
    kick();
    let mut sleep = Duration::from_micros(20);
    loop {
        if let Some((status, groups_enabled)) = poll_ack(region, seq) {
            return Ok(Ack {
                seq,
                status,
                groups_enabled,
                latency: t0.elapsed(),
            });
        }
        if t0.elapsed() >= timeout {
            bail!(
                "no acknowledgement of command #{seq} within {:.1} s (is ivtrace.ko loaded and \
                 bound to this device? an ivshmem-plain guest reads commands every flush_ms)",
                timeout.as_secs_f64()
            );
        }
        std::thread::sleep(sleep);
        sleep = (sleep * 2).min(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vectors() -> serde_json::Value {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../abi/vectors.json");
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    }

    #[test]
    fn offsets_match_abi_vectors() {
        let v = vectors();
        let g = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} missing"));
        let h = |f: &str| g(&format!("offsetof.ivt_region_hdr.{f}"));
        assert_eq!(off::DOORBELLS, h("doorbells"));
        assert_eq!(off::HOST_SLEEPING, h("host_sleeping"));
        assert_eq!(off::HOST_PEER_ID, h("host_peer_id"));
        assert_eq!(off::HOST_VECTOR, h("host_vector"));
        assert_eq!(off::FLUSH_INTERVAL_MS, h("flush_interval_ms"));
        assert_eq!(off::CONTROL, h("control"));
        assert_eq!(off::SYNC, h("sync"));
        let c = |f: &str| off::CONTROL + g(&format!("offsetof.ivt_control.{f}"));
        assert_eq!(off::CMD_SEQ, c("cmd_seq"));
        assert_eq!(off::CMD, c("cmd"));
        assert_eq!(off::ARG, c("arg"));
        assert_eq!(off::ACK_SEQ, c("ack_seq"));
        assert_eq!(off::ACK_STATUS, c("ack_status"));
        assert_eq!(off::GROUPS_ENABLED, c("groups_enabled"));
        let s = |f: &str| off::SYNC + g(&format!("offsetof.ivt_sync.{f}"));
        assert_eq!(off::REQ_SEQ, s("req_seq"));
        assert_eq!(off::HOST_T1, s("host_t1"));
        assert_eq!(off::RESP_SEQ, s("resp_seq"));
        assert_eq!(off::RESP_T2, s("resp_t2"));
        assert_eq!(off::RESP_T3, s("resp_t3"));
        assert_eq!(IVT_FEAT_DOORBELL, g("IVT_FEAT_DOORBELL"));
        assert_eq!(IVT_FEAT_CONTROL, g("IVT_FEAT_CONTROL"));
        assert_eq!(IVT_FEAT_SYNC, g("IVT_FEAT_SYNC"));
        for (cmd, name) in [
            (Command::Flush, "IVT_CMD_FLUSH"),
            (Command::Enable(1), "IVT_CMD_ENABLE"),
            (Command::Disable(1), "IVT_CMD_DISABLE"),
            (Command::SetMode(0), "IVT_CMD_SET_MODE"),
            (Command::Statedump, "IVT_CMD_STATEDUMP"),
        ] {
            assert_eq!(cmd.code() as u64, g(name));
        }
    }

    #[test]
    fn commands_and_groups_parse() {
        let w = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(Command::parse(&w("flush")).unwrap(), Command::Flush);
        assert_eq!(
            Command::parse(&w("enable sched,syscall")).unwrap(),
            Command::Enable(0b10001)
        );
        assert_eq!(
            Command::parse(&w("disable all")).unwrap(),
            Command::Disable(0x3f)
        );
        assert_eq!(
            Command::parse(&w("mode overwrite")).unwrap(),
            Command::SetMode(1)
        );
        assert!(Command::parse(&w("enable bogus")).is_err());
        assert!(Command::parse(&w("flush now")).is_err());
        assert!(Command::parse(&w("mode")).is_err());
        assert_eq!(group_names(0b100001), vec!["sched", "printk"]);
    }
}
