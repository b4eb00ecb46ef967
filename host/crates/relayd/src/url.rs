//! `net://HOST[:CTRL[:DATA]]`: where a relay daemon listens, as
//! `lttng create --set-url` spells it (LTTng's default ports: control
//! 5342, data 5343; the live viewer port, 5344, is the viewer's business).

use std::fmt;

/// LTTng's default control port.
pub const DEFAULT_CONTROL_PORT: u16 = 5342;
/// LTTng's default data port.
pub const DEFAULT_DATA_PORT: u16 = 5343;

/// A relay daemon's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayUrl {
    pub host: String,
    pub control_port: u16,
    pub data_port: u16,
}

impl fmt::Display for RelayUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "net://{}:{}:{}",
            self.host, self.control_port, self.data_port
        )
    }
}

fn port(s: &str, what: &str) -> Result<u16, String> {
    s.parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| format!("bad {what} port `{s}` (1..65535)"))
}

/// Parses `net://HOST[:CTRL[:DATA]]`; `HOST` may be a name or an IPv4
/// address, or an IPv6 address in brackets (`net://[::1]:5342`). A data
/// port defaults to the control port + 1 when only the control port is
/// given, as LTTng does.
pub fn parse(s: &str) -> Result<RelayUrl, String> {
    let rest = s
        .strip_prefix("net://")
        .or_else(|| s.strip_prefix("tcp://"))
        .ok_or_else(|| format!("`{s}` is not a relay URL: expected net://HOST[:CTRL[:DATA]]"))?;
    let rest = rest.trim_end_matches('/');
    let (host, ports) = match rest.strip_prefix('[') {
        Some(v6) => {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("`{s}`: unclosed [ in the host"))?;
            (h, after.strip_prefix(':').unwrap_or(after))
        }
        None => match rest.split_once(':') {
            Some((h, p)) => (h, p),
            None => (rest, ""),
        },
    };
    if host.is_empty() {
        return Err(format!("`{s}` names no host"));
    }
    let mut parts = ports.split(':').filter(|p| !p.is_empty());
    let control_port = match parts.next() {
        Some(p) => port(p, "control")?,
        None => DEFAULT_CONTROL_PORT,
    };
    let data_port = match parts.next() {
        Some(p) => port(p, "data")?,
        None if ports.is_empty() => DEFAULT_DATA_PORT,
        None => control_port
            .checked_add(1)
            .ok_or_else(|| format!("`{s}`: no data port after {control_port}"))?,
    };
    if parts.next().is_some() {
        return Err(format!("`{s}`: at most two ports (control, data)"));
    }
    Ok(RelayUrl {
        host: host.to_string(),
        control_port,
        data_port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        let u = parse("net://relay.example").unwrap();
        assert_eq!((u.control_port, u.data_port), (5342, 5343));
        let u = parse("net://127.0.0.1:6000").unwrap();
        assert_eq!(
            (u.host.as_str(), u.control_port, u.data_port),
            ("127.0.0.1", 6000, 6001)
        );
        let u = parse("net://h:6000:7000/").unwrap();
        assert_eq!((u.control_port, u.data_port), (6000, 7000));
        let u = parse("net://[::1]:1:2").unwrap();
        assert_eq!(
            (u.host.as_str(), u.control_port, u.data_port),
            ("::1", 1, 2)
        );
        assert!(parse("file:///tmp").is_err());
        assert!(parse("net://").is_err());
        assert!(parse("net://h:0").is_err());
        assert!(parse("net://h:1:2:3").is_err());
    }
}
