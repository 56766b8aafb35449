//! Validation and the pure evaluator: data in, decision out. No I/O, no logging, no clock.
//!
//! Semantics follow the reference (daiv-sandbox `egress/policy.py`):
//! - CONNECT is a reachability check only: any rule whose host matches lets the tunnel open, and
//!   the method is enforced per request once TLS is terminated.
//! - Rules are scanned in order; the first rule matching both host and method allows (and its
//!   `inject` applies). If a rule lists the host but none permits the method, the request is
//!   denied even under `default: allow` (otherwise a per-host method limit would be a no-op),
//!   and the denial reports the first rule whose host matched.
//! - A `deny` rule refuses its host (tunnel and every request) when it is the first rule
//!   that decides for the host, even under `default: allow`.
//! - `credential` rules never decide: when the deciding rule (or the default) allows a request
//!   and injects nothing, the first `credential` rule matching host, method and path injects.
//! - `intercept: credentialed` still intercepts a host whose rules inject or restrict methods,
//!   since neither can be enforced through a blind tunnel.
//! - A rule whose host is an IP literal (`10.0.0.5`, `2001:db8::1`, `[2001:db8::1]`) matches that
//!   address, compared as an address: as a glob, `[2001:db8::1]` would be a character class that
//!   matches nothing, and a method restriction on it would silently not apply.
//!
//! # Layout
//! - this file: the [`Evaluator`], a validated policy with its rules compiled once;
//! - `decision`: what it answers ([`Reason`], [`ConnectDecision`], [`RequestDecision`]);
//! - `validation`: what a policy file must satisfy ([`validate`], [`validate_for_api`]) and the
//!   operator hints of `policy check` ([`warnings`]);
//! - `hosts`: how a rule's host is parsed, normalised and matched;
//! - `paths`: path globs and the ambiguous-path rule ([`path_is_ambiguous`]);
//! - `headers`: header names and values a policy may inject ([`is_header_value`]).

mod decision;
mod headers;
mod hosts;
mod paths;
mod validation;

use std::collections::BTreeMap;

use globset::GlobMatcher;

use crate::error::PolicyError;
use crate::host::Host;
use crate::model::{
    DefaultAction, HeaderSecret, InterceptMode, PolicyFile, PolicyMode, RuleAction,
};

pub use decision::{ConnectDecision, Injection, Reason, RequestDecision};
pub use headers::is_header_value;
use hosts::HostPattern;
use paths::compile_path_glob;
pub use paths::path_is_ambiguous;
pub use validation::{validate, validate_for_api, warnings};

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
    action: RuleAction,
}

/// Whether a rule's methods and paths let one request through.
struct Permits {
    method: bool,
    path: bool,
}

impl CompiledRule {
    /// `method` upper-case; `path` `None` when unknown or ambiguous (no path rule matches it).
    fn permits(&self, method: &str, path: Option<&str>) -> Permits {
        Permits {
            method: self
                .methods
                .as_ref()
                .is_none_or(|ms| ms.iter().any(|m| m == method)),
            path: match (&self.paths, path) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(globs), Some(p)) => globs.iter().any(|g| g.is_match(p)),
            },
        }
    }
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
                    action: rule.action,
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
            match rule.action {
                // The first deciding rule refuses: nothing opens, whatever follows.
                RuleAction::Deny if first.is_none() => {
                    return ConnectDecision {
                        allowed: false,
                        intercept: false,
                        reason: Reason::RuleDenied,
                        rule: Some(index),
                    };
                }
                RuleAction::Deny => {}
                RuleAction::Allow => {
                    first.get_or_insert(index);
                    must_intercept |=
                        rule.inject.is_some() || rule.methods.is_some() || rule.paths.is_some();
                }
                // Decides nothing, but its credential can only be set after TLS is terminated.
                RuleAction::Credential => must_intercept = true,
            }
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
                intercept: intercept_all || must_intercept,
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
            match rule.action {
                RuleAction::Credential => continue,
                // A deny rule before any rule that permits: refused, whatever follows.
                RuleAction::Deny => return deny(Reason::RuleDenied, Some(index)),
                RuleAction::Allow => {}
            }
            first_listed.get_or_insert(index);
            let permits = rule.permits(&method, path);
            if permits.method && !permits.path {
                path_denied.get_or_insert(index);
            }
            if permits.method && permits.path {
                let inject = match self.injection(rule) {
                    Some(own) => Some(own),
                    None => self.credential_for(host, &method, path),
                };
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
                inject: self.credential_for(host, &method, path),
            },
            (None, DefaultAction::Deny) => deny(Reason::HostNotListed, None),
        }
    }

    /// The header rule `rule` names, if it names a secret.
    fn injection(&self, rule: &CompiledRule) -> Option<Injection> {
        let secret = self.secrets.get(rule.inject.as_ref()?)?;
        Some(Injection {
            header: secret.header.clone(),
            value: secret.value.clone(),
        })
    }

    /// The first `credential` rule's header for an allowed request it matches.
    fn credential_for(&self, host: &Host, method: &str, path: Option<&str>) -> Option<Injection> {
        self.matching(host)
            .filter(|(_, r)| r.action == RuleAction::Credential)
            .find(|(_, r)| {
                let p = r.permits(method, path);
                p.method && p.path
            })
            .and_then(|(_, r)| self.injection(r))
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
