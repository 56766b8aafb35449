//! E2B's network settings as our egress policy and secrets. E2B allows all traffic unless told
//! otherwise, `denyOut` takes addresses, `allowOut` (hosts, addresses) wins over it, and `rules`
//! set headers on requests to a host (credentials the sandbox never sees). Here a session without
//! a gateway has no network at all, so:
//! - no `network` (and `allow_internet_access` not false): `E2B_DEFAULT_NETWORK` decides (`none`:
//!   no network; `allow`: the gateway allowing every host);
//! - `allow_internet_access: false` or `denyOut` with `0.0.0.0/0`: only `allowOut`'s hosts
//!   (no network at all when it is empty);
//! - `rules`: each host's headers become secrets the gateway injects (one rule per host); a rule
//!   for a host that is not reachable is dropped, as E2B's rules grant no access.
//!
//! What the gateway cannot honour is refused with a 400 naming it: CIDR ranges (other than
//! all traffic, or one address), `denyOut` of some addresses while the rest is allowed, more
//! than one header per host.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::refusal::Refusal;
use crate::config::{Config, DefaultNetwork};

const ALL_TRAFFIC: &str = "0.0.0.0/0";

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSpec {
    #[serde(default)]
    allow_out: Option<Vec<String>>,
    #[serde(default)]
    deny_out: Option<Vec<String>>,
    #[serde(default)]
    rules: Option<BTreeMap<String, Vec<HostRule>>>,
    /// Sent by `PUT …/network` (an update may switch the internet off).
    #[serde(default, rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    /// `false`: the sandbox's ports take its traffic access token (see [`super::ports`]).
    #[serde(default, rename = "allowPublicTraffic")]
    allow_public_traffic: Option<bool>,
}

impl NetworkSpec {
    /// An update's spec as E2B reads it: what it leaves out is cleared, so one that says nothing
    /// of egress (or only that the internet is allowed) allows every host (E2B's own default),
    /// never the deployment's create default.
    pub fn for_update(mut self) -> Self {
        let says = self.allow_out.as_ref().is_some_and(|v| !v.is_empty())
            || self.deny_out.as_ref().is_some_and(|v| !v.is_empty())
            || self.rules.as_ref().is_some_and(|r| !r.is_empty())
            || self.allow_internet_access == Some(false);
        if !says {
            self.allow_out = Some(vec![ALL_TRAFFIC.to_string()]);
        }
        self
    }

    /// Whether the sandbox's ports are closed to whoever lacks its traffic token.
    pub fn private_traffic(&self) -> bool {
        self.allow_public_traffic == Some(false)
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct HostRule {
    #[serde(default)]
    transform: Option<Transform>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Transform {
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

fn bad(msg: impl Into<String>) -> Refusal {
    Refusal::new(StatusCode::BAD_REQUEST, msg)
}

/// A destination of `allowOut` as a rule's host: a name or wildcard as it is, an address, or an
/// address as a `/32` (`/128`); other ranges are refused.
fn host(entry: &str) -> Result<String, Refusal> {
    let entry = entry.trim();
    match entry.split_once('/') {
        None if !entry.is_empty() => Ok(entry.to_ascii_lowercase()),
        Some((addr, bits)) => match (addr.parse::<std::net::IpAddr>(), bits) {
            (Ok(std::net::IpAddr::V4(a)), "32") => Ok(a.to_string()),
            (Ok(std::net::IpAddr::V6(a)), "128") => Ok(a.to_string()),
            _ => Err(bad(format!(
                "network: {entry:?}: address ranges are not supported by the egress gateway \
                 (give host names, single addresses, or {ALL_TRAFFIC} for all traffic)"
            ))),
        },
        None => Err(bad("network: an empty destination")),
    }
}

/// Whether `host` is reached under `allowed` (exact names, or `*.suffix` wildcards).
fn reachable(host: &str, allowed: &[String]) -> bool {
    allowed.iter().any(|a| {
        a == host
            || a.strip_prefix("*.")
                .is_some_and(|suffix| host.ends_with(&format!(".{suffix}")) || host == a)
    })
}

/// The `egress` block of a native create (or the body of a policy update) for E2B's settings;
/// `None`: no network.
pub fn policy(
    config: &Config,
    allow_internet_access: Option<bool>,
    spec: Option<&NetworkSpec>,
) -> Result<Option<Value>, Refusal> {
    let empty = NetworkSpec::default();
    let spec = spec.unwrap_or(&empty);
    let allow_out = spec.allow_out.clone().unwrap_or_default();
    let deny_out = spec.deny_out.clone().unwrap_or_default();
    let rules = spec.rules.as_ref();
    let internet = allow_internet_access.or(spec.allow_internet_access);
    let deny_all = internet == Some(false) || deny_out.iter().any(|d| d.trim() == ALL_TRAFFIC);
    let allow_all = allow_out.iter().any(|a| a.trim() == ALL_TRAFFIC);
    let asked =
        !allow_out.is_empty() || !deny_out.is_empty() || rules.is_some_and(|r| !r.is_empty());
    let default_allow = if allow_all {
        true
    } else if deny_all {
        false
    } else if !deny_out.is_empty() {
        return Err(bad(
            "network: denyOut of some addresses while the rest is allowed is not supported by \
             the egress gateway; deny all traffic (0.0.0.0/0) and list what is allowed in allowOut",
        ));
    } else if asked {
        true
    } else {
        // Neither network nor a refusal of the internet: the deployment's default.
        match config.e2b.default_network {
            DefaultNetwork::None => return Ok(None),
            DefaultNetwork::Allow => true,
        }
    };
    let hosts: Vec<String> = allow_out
        .iter()
        .filter(|a| a.trim() != ALL_TRAFFIC)
        .map(|a| host(a))
        .collect::<Result<_, _>>()?;
    if !default_allow && hosts.is_empty() {
        // Nothing may be reached: no gateway at all.
        return Ok(None);
    }
    if config.egress.ca.is_none() {
        return Err(bad(
            "network access goes through the egress gateway, which this deployment has not \
             enabled (DAIV_SANDBOX_EGRESS_CA_CERT_FILE and DAIV_SANDBOX_EGRESS_CA_KEY_FILE)",
        ));
    }
    let mut out_rules: Vec<Value> = Vec::new();
    let mut secrets = serde_json::Map::new();
    for (i, (pattern, list)) in rules.into_iter().flatten().enumerate() {
        let pattern = pattern.trim().to_ascii_lowercase();
        let mut headers: Vec<(&String, &String)> = list
            .iter()
            .filter_map(|r| r.transform.as_ref())
            .flat_map(|t| t.headers.iter())
            .collect();
        if headers.len() > 1 {
            return Err(bad(format!(
                "network.rules[{pattern:?}]: one header per host is supported by the egress \
                 gateway, {} given",
                headers.len()
            )));
        }
        let Some((name, value)) = headers.pop() else {
            continue;
        };
        if !default_allow && !reachable(&pattern, &hosts) {
            continue;
        }
        let secret = format!("e2b-rule-{i}");
        secrets.insert(secret.clone(), json!({ "header": name, "value": value }));
        out_rules.push(json!({ "host": pattern, "methods": ["*"], "inject": secret }));
    }
    for h in &hosts {
        // A host with a header already has its rule (which also lets it through).
        if out_rules.iter().any(|r| r["host"] == **h) {
            continue;
        }
        out_rules.push(json!({ "host": h, "methods": ["*"] }));
    }
    Ok(Some(json!({
        "policy": {
            "default": if default_allow { "allow" } else { "deny" },
            "intercept": "credentialed",
            "rules": out_rules,
        },
        "secrets": secrets,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test settings, with an egress CA when `ca`.
    fn config(ca: bool) -> std::sync::Arc<Config> {
        let dir = std::env::temp_dir().join(format!("daiv-e2b-net-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let (cert, key) = (dir.join("ca.crt"), dir.join("ca.key"));
        std::fs::write(&cert, "CERT").expect("cert");
        std::fs::write(&key, "KEY").expect("key");
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        let extra: Vec<(&str, &str)> = if ca {
            vec![("EGRESS_CA_CERT_FILE", &cert), ("EGRESS_CA_KEY_FILE", &key)]
        } else {
            Vec::new()
        };
        crate::config::for_tests("k", &extra)
    }

    fn spec(v: Value) -> NetworkSpec {
        serde_json::from_value(v).expect("a network spec")
    }

    #[test]
    fn e2b_network_settings_become_a_policy_and_secrets() {
        let c = config(true);
        // An allowlist with a header for one of its hosts.
        let p = policy(
            &c,
            None,
            Some(&spec(json!({
                "denyOut": ["0.0.0.0/0"],
                "allowOut": ["api.example.test", "*.pkg.test"],
                "rules": {"API.example.test": [{"transform": {"headers": {"X-Token": "s3"}}}],
                          "not-allowed.test": [{"transform": {"headers": {"X-Token": "s4"}}}]},
            }))),
        )
        .expect("a policy")
        .expect("a gateway");
        assert_eq!(p["policy"]["default"], "deny");
        let rules = p["policy"]["rules"].as_array().expect("rules");
        assert_eq!(rules.len(), 2, "{p}");
        assert_eq!(rules[0]["host"], "api.example.test");
        let secret = rules[0]["inject"].as_str().expect("inject");
        assert_eq!(
            p["secrets"][secret],
            json!({"header": "X-Token", "value": "s3"})
        );
        assert!(
            !p.to_string().contains("s4"),
            "a rule for a host not allowed is dropped"
        );
        assert_eq!(rules[1]["host"], "*.pkg.test");
        // Rules alone: every host, the header injected.
        let p = policy(
            &c,
            None,
            Some(&spec(
                json!({"rules": {"a.test": [{"transform": {"headers": {"A": "1"}}}]}}),
            )),
        )
        .expect("a policy")
        .expect("a gateway");
        assert_eq!(p["policy"]["default"], "allow");
        // No internet and nothing allowed: no gateway at all; nothing asked: the default (none).
        assert!(policy(&c, Some(false), None).expect("ok").is_none());
        assert!(policy(&c, Some(true), None).expect("ok").is_none());
        assert!(policy(&c, None, None).expect("ok").is_none());
    }

    #[test]
    fn what_the_gateway_cannot_honour_is_a_400() {
        let c = config(true);
        for bad in [
            json!({"allowOut": ["10.0.0.0/8"]}),
            json!({"denyOut": ["10.0.0.1"]}),
            json!({"rules": {"a.test": [{"transform": {"headers": {"A": "1", "B": "2"}}}]}}),
        ] {
            let e = policy(&c, None, Some(&spec(bad.clone()))).expect_err("refused");
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
        let e = policy(
            &config(false),
            None,
            Some(&spec(json!({"allowOut": ["a.test"]}))),
        )
        .expect_err("no CA");
        assert!(e.detail.contains("EGRESS_CA"), "{}", e.detail);
    }

    #[test]
    fn hosts_ranges_and_wildcards() {
        assert_eq!(host("API.example.com").expect("a value"), "api.example.com");
        assert_eq!(host("10.0.0.1/32").expect("a value"), "10.0.0.1");
        assert!(host("10.0.0.0/8").is_err());
        let allowed = vec!["*.example.com".to_string(), "other.test".to_string()];
        assert!(reachable("api.example.com", &allowed));
        assert!(reachable("other.test", &allowed));
        assert!(!reachable("example.org", &allowed));
    }
}
