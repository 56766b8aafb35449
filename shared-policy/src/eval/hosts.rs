//! A rule's host: parsed once into an address or a glob over normalised host text, and the
//! reasons a glob could never match a normalised host.

use std::net::{IpAddr, Ipv6Addr};

use globset::{GlobBuilder, GlobMatcher};

use crate::host::Host;

/// How a rule's host is matched.
#[derive(Debug, Clone)]
pub(super) enum HostPattern {
    /// An IP literal, compared with the request's address (IPv4-mapped IPv6 as IPv4, as
    /// [`Host`] does), so any spelling of the address matches.
    Ip(IpAddr),
    /// A glob over the normalised host text.
    Glob(GlobMatcher),
}

impl HostPattern {
    /// Validates and compiles `policy.rules[].host`.
    pub(super) fn parse(raw: &str) -> Result<Self, String> {
        check_glob_text(raw)?;
        let text = raw.strip_suffix('.').unwrap_or(raw);
        if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']'))
            && inner.contains(':')
        {
            // A bracketed IPv6 literal; globset would read it as a character class.
            return inner
                .parse::<Ipv6Addr>()
                .map(|ip| Self::ip(IpAddr::V6(ip)))
                .map_err(|_| {
                    "a bracketed host must be an IPv6 address (and ports are not matched)"
                        .to_owned()
                });
        }
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Ok(Self::ip(ip));
        }
        // `host:port` or `[v6]:port`. Hosts are matched on every port, and the rule would match
        // no normalised host (those never carry a port), silently dropping its restriction.
        if text.contains("]:") || text.matches(':').count() == 1 {
            return Err(
                "must not include a port: rules match the host on any port; write the host alone"
                    .to_owned(),
            );
        }
        compile_glob(&normalise_glob(raw)).map(Self::Glob)
    }

    fn ip(ip: IpAddr) -> Self {
        Self::Ip(Host::from_ip(ip).ip().unwrap_or(ip))
    }

    pub(super) fn matches(&self, host: &Host) -> bool {
        match self {
            Self::Ip(ip) => host.ip() == Some(*ip),
            Self::Glob(m) => m.is_match(host.as_str()),
        }
    }
}

/// Why no normalised host can match the (normalised) glob `glob`, if that is so. Hosts are lower
/// case `[a-z0-9._-]` with no empty label (IPv6 addresses: hex digits and `:`), so a glob that
/// needs anything else is dead, and under `default: allow` its method restriction never applies.
pub(super) fn never_matches(glob: &str) -> Option<String> {
    if let Some(rest) = glob.strip_prefix('.') {
        return Some(format!(
            "it starts with a dot; for subdomains write \"*.{rest}\""
        ));
    }
    if glob.contains("..") || glob.ends_with('.') {
        return Some(
            "it has an empty label (\"..\", or a trailing dot beyond the one that is stripped)"
                .to_owned(),
        );
    }
    let chars: Vec<char> = glob.chars().collect();
    let (mut i, mut wildcard) = (0, false);
    while let Some(&c) = chars.get(i) {
        match c {
            '*' | '?' => wildcard = true,
            '[' => {
                // Skip the class: `[!...]` / `[^...]`, and a `]` right after the opening is literal.
                wildcard = true;
                let mut j = i + 1;
                if matches!(chars.get(j), Some('!' | '^')) {
                    j += 1;
                }
                if chars.get(j) == Some(&']') {
                    j += 1;
                }
                while chars.get(j).is_some_and(|&c| c != ']') {
                    j += 1;
                }
                i = j;
            }
            c if c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | '_') => {}
            // IPv6 addresses in text form (the only hosts with a colon).
            ':' => {}
            c => return Some(format!("it contains {c:?}, which no normalised host has")),
        }
        i += 1;
    }
    if wildcard {
        return None;
    }
    match Host::parse(glob) {
        Ok(host) if host.as_str() == glob => None,
        Ok(host) => Some(format!("hosts are normalised to {:?}", host.as_str())),
        Err(crate::host::HostError::AmbiguousNumeric) => Some(
            "all-numeric names such as \"127.1\" are refused as ambiguous; write a full IP address"
                .to_owned(),
        ),
        Err(e) => Some(format!("it is not a valid host ({e})")),
    }
}

fn check_glob_text(glob: &str) -> Result<(), String> {
    if glob.trim().is_empty() {
        return Err("must not be empty".to_owned());
    }
    if glob.chars().any(char::is_whitespace) {
        return Err("must not contain whitespace".to_owned());
    }
    // Hosts never contain these; globset would give `{a,b}` and `\` meanings fnmatch does not.
    if let Some(c) = glob
        .chars()
        .find(|c| matches!(c, '{' | '}' | '\\' | '/' | '@' | '#' | '%'))
    {
        return Err(format!("must not contain {c:?}"));
    }
    Ok(())
}

/// Lower case, no trailing dot, non-ASCII labels as punycode: the rule side of normalisation.
pub(super) fn normalise_glob(glob: &str) -> String {
    let trimmed = glob.strip_suffix('.').unwrap_or(glob);
    let joined = trimmed
        .split('.')
        .map(|label| {
            if label.is_ascii() {
                label.to_ascii_lowercase()
            } else {
                idna::domain_to_ascii(label).unwrap_or_else(|_| label.to_lowercase())
            }
        })
        .collect::<Vec<_>>()
        .join(".");
    // As `Host::parse` does: IDNA maps other full stops (`。`) to `.`, and a trailing one is the
    // root's dot unless a `.` was already stripped.
    match joined.strip_suffix('.') {
        Some(stripped) if trimmed.len() == glob.len() => stripped.to_owned(),
        _ => joined,
    }
}

fn compile_glob(glob: &str) -> Result<GlobMatcher, String> {
    GlobBuilder::new(glob)
        .case_insensitive(true)
        .literal_separator(false)
        .backslash_escape(false)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| format!("not a valid glob: {}", e.kind()))
}
