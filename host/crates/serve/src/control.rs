//! Control commands as people type them: `flush`, `enable sched,irq`,
//! `disable all`, `mode overwrite`, `statedump`, and the event group names
//! of the enable/disable masks. Posting a command and awaiting its
//! acknowledgement is the host's half of the protocol
//! (`ivtrace_region::protocol`).

use thiserror::Error;

use ivtrace_region::Command;

/// A control command that is not one: the wording is what `ivtrace ctl`
/// prints and what the control socket answers.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CommandError {
    #[error("no command (flush, enable, disable, mode, statedump)")]
    Empty,
    #[error("unknown command `{0}` (flush, enable, disable, mode, statedump)")]
    Unknown(String),
    #[error("`{verb}` takes exactly one argument: {what}")]
    OneArgument { verb: String, what: &'static str },
    #[error("`{0}` takes no argument")]
    NoArgument(String),
    #[error("unknown mode `{0}` (discard or overwrite)")]
    UnknownMode(String),
    #[error("unknown event group `{0}` (known: {groups}, all)", groups = GROUPS.join(", "))]
    UnknownGroup(String),
    #[error("no event group given (known: {groups}, all)", groups = GROUPS.join(", "))]
    NoGroup,
}

type Result<T> = std::result::Result<T, CommandError>;

/// Event groups: bit n of the enable/disable argument (ivtrace_kapi.h).
pub const GROUPS: [&str; 6] = ["sched", "irq", "timer", "kmem", "syscall", "printk"];

/// Parses `flush`, `enable GROUPS`, `disable GROUPS`,
/// `mode discard|overwrite`, `statedump`.
pub fn parse_command(words: &[String]) -> Result<Command> {
    let (verb, rest) = words.split_first().ok_or(CommandError::Empty)?;
    let one = |what: &'static str| -> Result<&String> {
        match rest {
            [x] => Ok(x),
            _ => Err(CommandError::OneArgument {
                verb: verb.clone(),
                what,
            }),
        }
    };
    let none = || -> Result<()> {
        if rest.is_empty() {
            Ok(())
        } else {
            Err(CommandError::NoArgument(verb.clone()))
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
            m => return Err(CommandError::UnknownMode(m.to_string())),
        }),
        v => return Err(CommandError::Unknown(v.to_string())),
    })
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
            None => return Err(CommandError::UnknownGroup(g.to_string())),
        }
    }
    if mask == 0 {
        return Err(CommandError::NoGroup);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_groups_parse() {
        let w = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(parse_command(&w("flush")).unwrap(), Command::Flush);
        assert_eq!(
            parse_command(&w("enable sched,syscall")).unwrap(),
            Command::Enable(0b10001)
        );
        assert_eq!(
            parse_command(&w("disable all")).unwrap(),
            Command::Disable(0x3f)
        );
        assert_eq!(
            parse_command(&w("mode overwrite")).unwrap(),
            Command::SetMode(1)
        );
        assert!(parse_command(&w("enable bogus")).is_err());
        assert!(parse_command(&w("flush now")).is_err());
        assert!(parse_command(&w("mode")).is_err());
        assert_eq!(group_names(0b100001), vec!["sched", "printk"]);
    }
}
