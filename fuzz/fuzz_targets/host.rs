//! Host normalisation: `Host::parse` and `Host::parse_authority`.
//!
//! Input: any bytes (lossy UTF-8). Invariants, beyond "no panic":
//! - a normalised name is lower-case `[a-z0-9._-]` labels, none empty, the last not numeric (or
//!   an IP literal, then canonical and never IPv4-mapped IPv6);
//! - normalisation is idempotent, through both `as_str` and `Display`, and `host:port` of a
//!   normalised host parses back to the same host and port;
//! - ASCII case and one trailing dot do not change the result;
//! - a policy rule naming the host (as given, or normalised) matches it: a rule can never be
//!   dodged by a spelling that normalises to its host.
#![no_main]

use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use shared_policy::{Evaluator, Host, Reason};

fuzz_target!(|data: &[u8]| {
    let input = String::from_utf8_lossy(data);
    let input = input.as_ref();

    let parsed = Host::parse(input);
    if let Ok(h) = &parsed {
        check_normal(h);
        if input.is_ascii() {
            assert_eq!(
                Host::parse(&input.to_ascii_uppercase()).as_ref(),
                Ok(h),
                "case changed {input:?}"
            );
            assert_eq!(
                Host::parse(&input.to_ascii_lowercase()).as_ref(),
                Ok(h),
                "case changed {input:?}"
            );
        }
        // (ASCII only: IDNA maps other full stops to `.`, and `a。.` has two trailing dots.)
        if input.is_ascii() && !input.ends_with('.') {
            assert_eq!(
                Host::parse(&format!("{input}.")).as_ref(),
                Ok(h),
                "trailing dot changed {input:?}"
            );
        }
        // A rule naming the host, as written and normalised, matches it.
        rule_matches(h.as_str(), h, true);
        let plain = !input.contains(['*', '?', '[', ']']);
        if plain {
            rule_matches(input, h, false);
        }
    }

    match Host::parse_authority(input) {
        Ok((h, port)) => {
            check_normal(&h);
            assert_ne!(port, Some(0));
            let text = match port {
                Some(p) => format!("{h}:{p}"),
                None => h.to_string(),
            };
            let again = Host::parse_authority(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(again, (h.clone(), port), "{input:?} -> {text:?}");
            if port.is_none() && !input.starts_with('[') {
                assert_eq!(parsed.as_ref(), Ok(&h), "{input:?}");
            }
        }
        Err(_) => {
            // Without a port, an authority is refused only if the bare host is.
            if !input.contains(':') {
                assert!(parsed.is_err(), "{input:?}: host ok, authority refused");
            }
        }
    }
});

fn check_normal(h: &Host) {
    let name = h.as_str();
    match h.ip() {
        Some(ip) => {
            assert_eq!(name, ip.to_string());
            if let IpAddr::V6(v6) = ip {
                assert!(
                    v6.to_ipv4_mapped().is_none(),
                    "{name}: IPv4-mapped kept as IPv6"
                );
            }
        }
        None => {
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)),
                "{name:?}"
            );
            assert!(!name.split('.').any(str::is_empty), "{name:?}: empty label");
            let last = name.rsplit('.').next().unwrap_or(name);
            assert!(
                !last.bytes().all(|b| b.is_ascii_digit()),
                "{name:?}: numeric"
            );
        }
    }
    assert_eq!(
        Host::parse(name).as_ref(),
        Ok(h),
        "not idempotent: {name:?}"
    );
    assert_eq!(
        Host::parse(&h.to_string()).as_ref(),
        Ok(h),
        "Display not idempotent: {h}"
    );
}

/// A deny-default policy with one rule for `rule_host`: `host` must be allowed by it. `must`:
/// the rule has to be valid (a normalised host always is).
fn rule_matches(rule_host: &str, host: &Host, must: bool) {
    let doc = serde_json::json!({
        "policy": {"default": "deny", "rules": [{"host": rule_host, "methods": ["GET"]}]}
    });
    let ev = match Evaluator::from_json(doc.to_string().as_bytes()) {
        Ok(ev) => ev,
        Err(e) if !must => {
            let _ = e;
            return;
        }
        Err(e) => panic!("rule {rule_host:?} for a normalised host refused: {e}"),
    };
    let c = ev.decide_connect(host);
    assert!(
        c.allowed && c.reason == Reason::RuleAllowed,
        "rule {rule_host:?} does not match host {host}: {c:?}"
    );
    let d = ev.decide_http(host, "GET", Some("/"));
    assert!(d.allowed, "rule {rule_host:?} does not allow GET on {host}");
}
