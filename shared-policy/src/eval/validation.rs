//! What a policy file must satisfy before anything enforces it, and the hints `policy check`
//! gives about a valid file that probably does not mean what it says.

use crate::error::PolicyError;
use crate::model::{DefaultAction, PolicyFile, PolicyMode, RuleAction};

use super::headers::{check_header_name, is_header_value, is_token};
use super::hosts::{HostPattern, never_matches, normalise_glob};
use super::paths::compile_path_glob;

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
        let misfit = match rule.action {
            RuleAction::Allow => None,
            RuleAction::Deny if rule.inject.is_some() => Some("a deny rule injects nothing"),
            RuleAction::Deny if rule.paths.is_some() => Some("a deny rule takes no paths"),
            RuleAction::Deny if rule.methods.iter().any(|m| m != "*") => {
                Some("a deny rule denies every method: its methods must be [\"*\"]")
            }
            RuleAction::Deny => None,
            RuleAction::Credential if rule.inject.is_none() => {
                Some("a credential rule names the secret it injects")
            }
            RuleAction::Credential => None,
        };
        if let Some(reason) = misfit {
            return Err(PolicyError::InvalidAction {
                index,
                reason: reason.to_owned(),
            });
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
    let allows = |r: &crate::model::Rule| r.action == RuleAction::Allow;
    if file.policy.default == DefaultAction::Deny && !file.policy.rules.iter().any(allows) {
        return Err(PolicyError::NothingReachable);
    }
    // Report-only would let the agent lift its own restrictions; the wire schema has no such
    // field, so the API refuses it rather than ignoring it.
    if file.policy.mode == PolicyMode::Shadow {
        return Err(PolicyError::ShadowNotAllowed);
    }
    // A door's state is the service's own: taken from a caller, it would plant a credential
    // vault the caller's door never wrote.
    if file.door.is_some() {
        return Err(PolicyError::DoorNotAllowed);
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
