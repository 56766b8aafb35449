//! Validation and the pure evaluator: data in, decision out. No I/O, no logging, no clock.
//!
//! Semantics follow the reference (daiv-sandbox `egress/policy.py`):
//! - CONNECT is a reachability check only: any rule whose host matches lets the tunnel open, and
//!   the method is enforced per request once TLS is terminated.
//! - Rules are scanned in order; the first rule matching both host and method allows (and its
//!   `inject` applies). If a rule lists the host but none permits the method, the request is
//!   denied even under `default: allow` (otherwise a per-host method limit would be a no-op),
//!   and the denial reports the first rule whose host matched.
//! - `intercept: credentialed` still intercepts a host whose rules inject or restrict methods,
//!   since neither can be enforced through a blind tunnel.
//! - A rule whose host is an IP literal (`10.0.0.5`, `2001:db8::1`, `[2001:db8::1]`) matches that
//!   address, compared as an address: as a glob, `[2001:db8::1]` would be a character class that
//!   matches nothing, and a method restriction on it would silently not apply.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr};

use globset::{GlobBuilder, GlobMatcher};

use crate::error::PolicyError;
use crate::host::Host;
use crate::model::{
    DefaultAction, HeaderSecret, InterceptMode, PolicyFile, PolicyMode, SecretValue,
};

/// Stable reason codes: they go to the agent in `X-Egress-Denied` and to the audit log, so
/// renaming one is a breaking change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// Allowed: a rule matched host (and method, for a request).
    RuleAllowed,
    /// Allowed: no rule lists the host and the default is `allow`.
    DefaultAllow,
    /// Denied: no rule lists the host and the default is `deny`.
    HostNotListed,
    /// Denied: a rule lists the host, but no rule for it permits this method.
    MethodNotAllowed,
    /// Denied: the policy file is missing or invalid, so everything is denied (fail closed).
    PolicyUnavailable,
    /// Denied: a rule for the host permits this method, but only on other paths (or the path
    /// is ambiguous: dot segments, encoded slashes, empty segments).
    PathNotAllowed,
}

// === impl Reason ===

impl Reason {
    /// The stable code.
    pub fn code(self) -> &'static str {
        match self {
            Self::RuleAllowed => "rule-allowed",
            Self::DefaultAllow => "default-allow",
            Self::HostNotListed => "host-not-listed",
            Self::MethodNotAllowed => "method-not-allowed",
            Self::PolicyUnavailable => "policy-unavailable",
            Self::PathNotAllowed => "path-not-allowed",
        }
    }

    /// One sentence for the 403 body and for `policy explain`.
    pub fn describe(self) -> &'static str {
        match self {
            Self::RuleAllowed => "a rule allows this host and method",
            Self::DefaultAllow => "no rule lists this host and the policy default is allow",
            Self::HostNotListed => "no rule lists this host and the policy default is deny",
            Self::MethodNotAllowed => "a rule lists this host but does not permit this method",
            Self::PolicyUnavailable => {
                "the egress policy is missing or invalid, so all egress is denied"
            }
            Self::PathNotAllowed => {
                "a rule lists this host and method but not this path (dot segments and encoded slashes never match)"
            }
        }
    }
}

/// The outcome of a CONNECT (reachability) check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectDecision {
    /// Whether the tunnel may open.
    pub allowed: bool,
    /// Whether TLS must be terminated (MITM) so requests can be checked or credentialed.
    pub intercept: bool,
    /// Why.
    pub reason: Reason,
    /// Index of the rule that decided, if one did.
    pub rule: Option<usize>,
}

/// A header to set on the upstream request, replacing any the client sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    /// Header name (validated token).
    pub header: String,
    /// Header value (validated: [`is_header_value`]).
    pub value: SecretValue,
}

/// The outcome of a check on one HTTP request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestDecision {
    /// Whether the request may go upstream.
    pub allowed: bool,
    /// Why.
    pub reason: Reason,
    /// Index of the rule that decided: the allowing rule, or for a method denial the first rule
    /// whose host matched.
    pub rule: Option<usize>,
    /// The credential to inject, if the allowing rule names one.
    pub inject: Option<Injection>,
}

/// A rule after validation: glob compiled once.
#[derive(Debug, Clone)]
struct CompiledRule {
    host: String,
    pattern: HostPattern,
    /// `None` = any method (`"*"` listed).
    methods: Option<Vec<String>>,
    inject: Option<String>,
    /// `None` = every path.
    paths: Option<Vec<GlobMatcher>>,
    /// The path globs as written.
    path_text: Option<Vec<String>>,
}

/// Where an evaluator came from: a real policy, or the fail-closed stand-in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Policy,
    DenyAll,
}

/// A validated policy, ready to answer decisions. Cheap to share behind an `Arc`.
#[derive(Debug, Clone)]
pub struct Evaluator {
    origin: Origin,
    default: DefaultAction,
    intercept: InterceptMode,
    rules: Vec<CompiledRule>,
    secrets: BTreeMap<String, HeaderSecret>,
    shadow: bool,
    version: Option<String>,
}

// === impl Evaluator ===

impl Evaluator {
    /// Parses and validates a policy file.
    pub fn from_json(bytes: &[u8]) -> Result<Self, PolicyError> {
        let file: PolicyFile = serde_json::from_slice(bytes).map_err(|e| PolicyError::parse(&e))?;
        Self::from_file_model(file)
    }

    /// Validates an already-parsed policy file.
    pub fn from_file_model(file: PolicyFile) -> Result<Self, PolicyError> {
        validate(&file)?;
        let rules = file
            .policy
            .rules
            .iter()
            .enumerate()
            .map(|(index, rule)| {
                let pattern = HostPattern::parse(&rule.host)
                    .map_err(|reason| PolicyError::InvalidHost { index, reason })?;
                let any = rule.methods.iter().any(|m| m == "*");
                let paths = match &rule.paths {
                    None => None,
                    Some(globs) => Some(
                        globs
                            .iter()
                            .map(|g| compile_path_glob(g))
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(|reason| PolicyError::InvalidPaths { index, reason })?,
                    ),
                };
                Ok(CompiledRule {
                    host: rule.host.clone(),
                    pattern,
                    methods: (!any).then(|| rule.methods.clone()),
                    inject: rule.inject.clone(),
                    paths,
                    path_text: rule.paths.clone(),
                })
            })
            .collect::<Result<Vec<_>, PolicyError>>()?;
        Ok(Self {
            origin: Origin::Policy,
            default: file.policy.default,
            intercept: file.policy.intercept,
            rules,
            secrets: file.secrets,
            shadow: file.policy.mode == PolicyMode::Shadow,
            version: file.version,
        })
    }

    /// The fail-closed policy used when the file is missing or invalid: every decision is a
    /// denial with reason `policy-unavailable`.
    pub fn deny_all() -> Self {
        Self {
            origin: Origin::DenyAll,
            default: DefaultAction::Deny,
            intercept: InterceptMode::All,
            rules: Vec::new(),
            secrets: BTreeMap::new(),
            shadow: false,
            version: None,
        }
    }

    /// True when the file asks for report-only mode (`policy.mode: "shadow"`). Never true for
    /// the deny-all stand-in: a broken file is always enforced.
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// The file's `version`, if it has one.
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// The path globs of rule `index`, as written, if it restricts paths.
    pub fn rule_paths(&self, index: usize) -> Option<&[String]> {
        self.rules.get(index).and_then(|r| r.path_text.as_deref())
    }

    /// True for the stand-in built by [`Evaluator::deny_all`].
    pub fn is_deny_all(&self) -> bool {
        self.origin == Origin::DenyAll
    }

    /// The host glob of rule `index`, as written (for logs and `policy explain`).
    pub fn rule_host(&self, index: usize) -> Option<&str> {
        self.rules.get(index).map(|r| r.host.as_str())
    }

    /// CONNECT: may a tunnel to `host` open, and must it be intercepted?
    pub fn decide_connect(&self, host: &Host) -> ConnectDecision {
        if self.is_deny_all() {
            return ConnectDecision {
                allowed: false,
                intercept: false,
                reason: Reason::PolicyUnavailable,
                rule: None,
            };
        }
        let intercept_all = self.intercept == InterceptMode::All;
        let mut first = None;
        // Any matching rule that injects or restricts methods forces interception, so that what
        // it demands can be enforced after TLS is terminated.
        let mut must_intercept = false;
        for (index, rule) in self.matching(host) {
            first.get_or_insert(index);
            must_intercept |=
                rule.inject.is_some() || rule.methods.is_some() || rule.paths.is_some();
        }
        match (first, self.default) {
            (Some(index), _) => ConnectDecision {
                allowed: true,
                intercept: intercept_all || must_intercept,
                reason: Reason::RuleAllowed,
                rule: Some(index),
            },
            (None, DefaultAction::Allow) => ConnectDecision {
                allowed: true,
                intercept: intercept_all,
                reason: Reason::DefaultAllow,
                rule: None,
            },
            (None, DefaultAction::Deny) => ConnectDecision {
                allowed: false,
                intercept: false,
                reason: Reason::HostNotListed,
                rule: None,
            },
        }
    }

    /// One HTTP request whose path is not known: rules restricted to paths do not apply.
    pub fn decide_request(&self, host: &Host, method: &str) -> RequestDecision {
        self.decide_http(host, method, None)
    }

    /// One HTTP request: may `method` go to `host` at `path` (no query string), and with which
    /// credential? With `path` `None`, or an ambiguous path (see [`path_is_ambiguous`]), no
    /// rule restricted to paths matches.
    pub fn decide_http(&self, host: &Host, method: &str, path: Option<&str>) -> RequestDecision {
        let deny = |reason, rule| RequestDecision {
            allowed: false,
            reason,
            rule,
            inject: None,
        };
        if self.is_deny_all() {
            return deny(Reason::PolicyUnavailable, None);
        }
        let method = method.to_ascii_uppercase();
        let path = path.filter(|p| !path_is_ambiguous(p));
        let mut first_listed = None;
        // The first rule that permits the method but not the path, if any.
        let mut path_denied = None;
        for (index, rule) in self.matching(host) {
            first_listed.get_or_insert(index);
            let permits = rule.methods.as_ref().is_none_or(|ms| ms.contains(&method));
            let on_path = match (&rule.paths, path) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(globs), Some(p)) => globs.iter().any(|g| g.is_match(p)),
            };
            if permits && !on_path {
                path_denied.get_or_insert(index);
            }
            if permits && on_path {
                let inject = rule
                    .inject
                    .as_ref()
                    .and_then(|name| self.secrets.get(name))
                    .map(|s| Injection {
                        header: s.header.clone(),
                        value: s.value.clone(),
                    });
                return RequestDecision {
                    allowed: true,
                    reason: Reason::RuleAllowed,
                    rule: Some(index),
                    inject,
                };
            }
        }
        if let Some(index) = path_denied {
            return deny(Reason::PathNotAllowed, Some(index));
        }
        match (first_listed, self.default) {
            // Listed but no rule permits the method: deny regardless of the default.
            (Some(index), _) => deny(Reason::MethodNotAllowed, Some(index)),
            (None, DefaultAction::Allow) => RequestDecision {
                allowed: true,
                reason: Reason::DefaultAllow,
                rule: None,
                inject: None,
            },
            (None, DefaultAction::Deny) => deny(Reason::HostNotListed, None),
        }
    }

    fn matching<'a>(
        &'a self,
        host: &'a Host,
    ) -> impl Iterator<Item = (usize, &'a CompiledRule)> + 'a {
        self.rules
            .iter()
            .enumerate()
            .filter(move |(_, r)| r.pattern.matches(host))
    }
}

// === validation ===

/// Checks everything the gateway needs to enforce the file as written.
pub fn validate(file: &PolicyFile) -> Result<(), PolicyError> {
    for (name, secret) in &file.secrets {
        check_header_name(&secret.header).map_err(|reason| PolicyError::InvalidHeaderName {
            name: name.clone(),
            reason: reason.to_owned(),
        })?;
        if !is_header_value(secret.value.expose()) {
            return Err(PolicyError::InvalidHeaderValue { name: name.clone() });
        }
    }
    for (index, rule) in file.policy.rules.iter().enumerate() {
        HostPattern::parse(&rule.host)
            .map_err(|reason| PolicyError::InvalidHost { index, reason })?;
        if rule.methods.is_empty() {
            return Err(PolicyError::InvalidMethods {
                index,
                reason: "must not be empty; use [\"*\"] for any method".to_owned(),
            });
        }
        if let Some(bad) = rule
            .methods
            .iter()
            .find(|m| m.as_str() != "*" && !is_token(m))
        {
            return Err(PolicyError::InvalidMethods {
                index,
                reason: format!("{bad:?} is not an HTTP method"),
            });
        }
        if let Some(paths) = &rule.paths {
            if paths.is_empty() {
                return Err(PolicyError::InvalidPaths {
                    index,
                    reason: "must not be empty; omit paths for every path".to_owned(),
                });
            }
            for glob in paths {
                compile_path_glob(glob)
                    .map_err(|reason| PolicyError::InvalidPaths { index, reason })?;
            }
        }
        if let Some(name) = rule
            .inject
            .as_ref()
            .filter(|n| !file.secrets.contains_key(*n))
        {
            return Err(PolicyError::UnknownSecret {
                index,
                name: name.clone(),
            });
        }
    }
    Ok(())
}

/// What the control plane's API accepts: [`validate`], and a deny-default policy must list at
/// least one rule (otherwise the caller asked for a network that reaches nothing).
pub fn validate_for_api(file: &PolicyFile) -> Result<(), PolicyError> {
    validate(file)?;
    if file.policy.default == DefaultAction::Deny && file.policy.rules.is_empty() {
        return Err(PolicyError::NothingReachable);
    }
    // Report-only would let the agent lift its own restrictions; the wire schema has no such
    // field, so the API refuses it rather than ignoring it.
    if file.policy.mode == PolicyMode::Shadow {
        return Err(PolicyError::ShadowNotAllowed);
    }
    Ok(())
}

/// Operator hints for `policy check`: valid, but probably not what was meant.
pub fn warnings(file: &PolicyFile) -> Vec<String> {
    let mut out = Vec::new();
    for (index, rule) in file.policy.rules.iter().enumerate() {
        match HostPattern::parse(&rule.host) {
            Ok(HostPattern::Glob(_)) => {}
            // Addresses are exact; an invalid rule is reported by `validate`.
            Ok(HostPattern::Ip(_)) | Err(_) => continue,
        }
        if let Some(why) = never_matches(&normalise_glob(&rule.host)) {
            out.push(format!(
                "policy.rules[{index}].host {:?} can never match: {why}",
                rule.host
            ));
            continue;
        }
        let rest = rule.host.strip_prefix("*.").unwrap_or(&rule.host);
        if rest.contains(['*', '?', '[']) {
            out.push(format!(
                "policy.rules[{index}].host {:?} is broader than a leading \"*.\" (for example \"*github.com\" also matches \"evilgithub.com\")",
                rule.host
            ));
        }
        if rule.host.starts_with("*.") && !rest.contains(['*', '?', '[']) {
            // `*.example.com` does not match `example.com` itself; say so, it surprises people.
            let bare = rest;
            let listed = file
                .policy
                .rules
                .iter()
                .any(|r| r.host.eq_ignore_ascii_case(bare));
            if !listed {
                out.push(format!(
                    "policy.rules[{index}].host {:?} does not match {bare:?} itself; add a rule for it if needed",
                    rule.host
                ));
            }
        }
    }
    for (index, rule) in file.policy.rules.iter().enumerate() {
        for glob in rule.paths.iter().flatten() {
            if glob.ends_with("/*") {
                out.push(format!(
                    "policy.rules[{index}].paths {glob:?} matches one path segment only; write \"{}/**\" for any depth",
                    glob.trim_end_matches("/*")
                ));
            }
        }
    }
    if file.policy.mode == PolicyMode::Shadow {
        out.push(
            "policy.mode is \"shadow\": denials are only reported, every request goes through"
                .to_owned(),
        );
    }
    for name in file.secrets.keys() {
        if !file
            .policy
            .rules
            .iter()
            .any(|r| r.inject.as_deref() == Some(name))
        {
            out.push(format!("secrets.{name} is not injected by any rule"));
        }
    }
    out
}

/// How a rule's host is matched.
#[derive(Debug, Clone)]
enum HostPattern {
    /// An IP literal, compared with the request's address (IPv4-mapped IPv6 as IPv4, as
    /// [`Host`] does), so any spelling of the address matches.
    Ip(IpAddr),
    /// A glob over the normalised host text.
    Glob(GlobMatcher),
}

impl HostPattern {
    /// Validates and compiles `policy.rules[].host`.
    fn parse(raw: &str) -> Result<Self, String> {
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

    fn matches(&self, host: &Host) -> bool {
        match self {
            Self::Ip(ip) => host.ip() == Some(*ip),
            Self::Glob(m) => m.is_match(host.as_str()),
        }
    }
}

/// Why no normalised host can match the (normalised) glob `glob`, if that is so. Hosts are lower
/// case `[a-z0-9._-]` with no empty label (IPv6 addresses: hex digits and `:`), so a glob that
/// needs anything else is dead, and under `default: allow` its method restriction never applies.
fn never_matches(glob: &str) -> Option<String> {
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
fn normalise_glob(glob: &str) -> String {
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

/// A path glob: starts with `/`, no whitespace, no `#` (fragment) or characters globset would
/// read differently from fnmatch; `*` stays within a segment, `**` spans segments.
fn compile_path_glob(glob: &str) -> Result<GlobMatcher, String> {
    if !glob.starts_with('/') {
        return Err(format!("{glob:?} must start with \"/\""));
    }
    if glob.chars().any(char::is_whitespace) {
        return Err(format!("{glob:?} must not contain whitespace"));
    }
    if let Some(c) = glob.chars().find(|c| matches!(c, '{' | '}' | '\\' | '#')) {
        return Err(format!("{glob:?} must not contain {c:?}"));
    }
    GlobBuilder::new(glob)
        .literal_separator(true)
        .backslash_escape(false)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| format!("{glob:?} is not a valid glob: {}", e.kind()))
}

/// A request path that origins may read as another path than a glob sees: dot segments (also
/// percent-encoded, or before a `;` parameter, as Tomcat reads `..;`), encoded slashes or
/// backslashes, literal backslashes, empty segments. No path-restricted rule matches such a path.
pub fn path_is_ambiguous(path: &str) -> bool {
    if !path.starts_with('/') || path.contains('\\') || path.contains("//") {
        return true;
    }
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2f") || lower.contains("%5c") || lower.contains("%00") {
        return true;
    }
    lower.split('/').any(|segment| {
        let segment = segment.split(';').next().unwrap_or_default();
        let decoded = segment.replace("%2e", ".");
        decoded == "." || decoded == ".."
    })
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

/// RFC 7230 `token` = 1*tchar.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Header names the proxy owns: injecting one would break message framing or the destination
/// binding, so a policy may not set them.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
];

/// Whether `value` can be sent as an HTTP header value as written: no control characters
/// (CR, LF and NUL would split the request; the others are refused by HTTP stacks, so a
/// credential holding one would fail every request it is injected into). Tab and any other
/// character are fine. The gateway's header type accepts exactly these (a test there checks it).
pub fn is_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

fn check_header_name(name: &str) -> Result<(), &'static str> {
    if !is_token(name) {
        return Err("not an RFC 7230 header name (token)");
    }
    if RESERVED_HEADERS
        .iter()
        .any(|r| r.eq_ignore_ascii_case(name))
    {
        return Err(
            "is a header the proxy manages (framing or destination) and cannot be injected",
        );
    }
    Ok(())
}
