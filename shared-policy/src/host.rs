//! Host normalisation: the one spelling of a host that rules are matched against.
//!
//! Without it, `GitHub.com.`, `github.com:443` and an IDNA spelling of the same name would each
//! need their own rule, and a case or trailing-dot variant could slip past a rule that denies.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use thiserror::Error;

/// Why a host string was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum HostError {
    /// Nothing left after stripping the port and the trailing dot.
    #[error("empty host")]
    Empty,
    /// The port is not a number in 1..=65535.
    #[error("invalid port")]
    InvalidPort,
    /// IDNA conversion failed or characters outside `[a-z0-9._-]` remained.
    #[error("invalid host name")]
    InvalidName,
    /// All-numeric names such as `127.1` or `0x7f.1`: some resolvers read them as addresses, so
    /// they could reach an address that the guard never saw as one.
    #[error("ambiguous numeric host name")]
    AmbiguousNumeric,
}

/// A normalised host: lower case, no trailing dot, IDNA as punycode, IP literals canonical.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Host {
    /// The normalised text that globs match (an IPv6 address without brackets).
    name: String,
    /// Set when the host is an IP literal.
    ip: Option<IpAddr>,
}

// === impl Host ===

impl Host {
    /// Normalises a bare host (no port). IPv6 literals may be bracketed.
    pub fn parse(input: &str) -> Result<Self, HostError> {
        let trimmed = input.strip_suffix('.').unwrap_or(input);
        if trimmed.is_empty() {
            return Err(HostError::Empty);
        }
        let unbracketed = trimmed.strip_prefix('[').and_then(|s| s.strip_suffix(']'));
        if let Some(v6) = unbracketed {
            let ip: Ipv6Addr = v6.parse().map_err(|_| HostError::InvalidName)?;
            return Ok(Self::from_ip(IpAddr::V6(ip)));
        }
        if let Ok(ip) = trimmed.parse::<IpAddr>() {
            return Ok(Self::from_ip(ip));
        }
        let ascii = idna::domain_to_ascii(trimmed).map_err(|_| HostError::InvalidName)?;
        // IDNA maps other full stops (`。`, `．`) to `.`: a trailing one is the root's dot, unless
        // a `.` was already stripped (two trailing dots are an empty label, as in `a..`).
        let ascii = match ascii.strip_suffix('.') {
            Some(stripped) if trimmed.len() == input.len() => stripped,
            _ => &ascii,
        }
        .to_owned();
        if ascii.is_empty() {
            return Err(HostError::Empty);
        }
        let valid = ascii.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')
        });
        if !valid || ascii.split('.').any(str::is_empty) {
            return Err(HostError::InvalidName);
        }
        if looks_numeric(&ascii) {
            return Err(HostError::AmbiguousNumeric);
        }
        Ok(Self {
            name: ascii,
            ip: None,
        })
    }

    /// Normalises `host[:port]` (the CONNECT authority or a `Host` header); IPv6 needs brackets
    /// when a port follows. Returns the host and the port if one was given.
    pub fn parse_authority(input: &str) -> Result<(Self, Option<u16>), HostError> {
        let (host, port) = split_port(input)?;
        Ok((Self::parse(host)?, port))
    }

    /// A host that is an IP address.
    pub fn from_ip(ip: IpAddr) -> Self {
        // An IPv4-mapped IPv6 address is the IPv4 address as far as matching and the guard go.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        Self {
            name: ip.to_string(),
            ip: Some(ip),
        }
    }

    /// The normalised name that rules match.
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The address, when the host is an IP literal.
    pub fn ip(&self) -> Option<IpAddr> {
        self.ip
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            Some(IpAddr::V6(_)) => write!(f, "[{}]", self.name),
            _ => f.write_str(&self.name),
        }
    }
}

/// Splits an optional `:port`. A bare IPv6 address (more than one colon, no brackets) has none.
fn split_port(input: &str) -> Result<(&str, Option<u16>), HostError> {
    let parse_port = |p: &str| -> Result<u16, HostError> {
        match p.parse::<u16>() {
            Ok(0) | Err(_) => Err(HostError::InvalidPort),
            Ok(port) => Ok(port),
        }
    };
    if input.starts_with('[') {
        let end = input.find(']').ok_or(HostError::InvalidName)?;
        let (host, rest) = input.split_at(end + 1);
        return match rest {
            "" => Ok((host, None)),
            _ => match rest.strip_prefix(':') {
                Some(p) => Ok((host, Some(parse_port(p)?))),
                None => Err(HostError::InvalidName),
            },
        };
    }
    match input.rsplit_once(':') {
        Some((host, _)) if host.contains(':') => Ok((input, None)),
        Some((host, port)) => Ok((host, Some(parse_port(port)?))),
        None => Ok((input, None)),
    }
}

/// True when the last label is numeric (decimal, or hex with `0x`): no real TLD is.
fn looks_numeric(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    let hex = last
        .strip_prefix("0x")
        .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    hex || last.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_names() {
        let cases = [
            ("GitHub.COM", "github.com"),
            ("github.com.", "github.com"),
            ("bücher.example", "xn--bcher-kva.example"),
            ("under_score.test", "under_score.test"),
            ("127.0.0.1", "127.0.0.1"),
            ("[::1]", "::1"),
            ("::FFFF:127.0.0.1", "127.0.0.1"),
            ("a\u{3002}b\u{3002}", "a.b"),
        ];
        for (input, want) in cases {
            let host = Host::parse(input).map_err(|e| format!("{input}: {e}"));
            assert_eq!(
                host.map(|h| h.as_str().to_owned()),
                Ok(want.to_owned()),
                "{input}"
            );
        }
    }

    #[test]
    fn refuses_bad_hosts() {
        for input in [
            "",
            ".",
            "a b.test",
            "a..b",
            // Found by fuzz/fuzz_targets/host.rs: two trailing dots normalised to `a`, which a
            // rule for `a..` (or `a.`) never matches.
            "a..",
            "example.com..",
            "a.\u{3002}",
            "127.1",
            "0x7f.1",
            "a/b",
            "exa%mple.com",
        ] {
            assert!(Host::parse(input).is_err(), "{input:?} should be refused");
        }
    }

    #[test]
    fn splits_ports() {
        let cases = [
            ("example.com:443", "example.com", Some(443)),
            ("Example.com", "example.com", None),
            ("[::1]:8443", "::1", Some(8443)),
            ("::1", "::1", None),
            ("10.0.0.1:80", "10.0.0.1", Some(80)),
        ];
        for (input, host, port) in cases {
            let (h, p) = Host::parse_authority(input)
                .map_err(|e| e.to_string())
                .unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!((h.as_str(), p), (host, port), "{input}");
        }
        for input in [
            "example.com:0",
            "example.com:x",
            "example.com:70000",
            "[::1]x",
        ] {
            assert!(Host::parse_authority(input).is_err(), "{input:?}");
        }
    }
}
