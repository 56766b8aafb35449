//! The policy parser, validator and evaluator, through the gateway's own loader.
//!
//! Input: a policy file, then NUL-separated queries `host \0 method \0 path` (any number of
//! triples; a missing part is a default). Invariants, beyond "no panic":
//! - the gateway loader (`policy_store::load`) yields deny-all exactly when `from_json` refuses
//!   the file, and deny-all denies every CONNECT and request with `policy-unavailable`, never
//!   in shadow mode;
//! - a policy that loads passes `validate`, and anything `validate_for_api` accepts it accepts;
//! - decisions are deterministic, the same for a policy re-read from its own serialisation, and
//!   consistent: a request allowed implies its CONNECT allowed; an injected credential is one
//!   the file declared; an ambiguous path decides like no path.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use daiv_sandbox_fuzz::split_once;
use egress_gateway::policy_store;
use libfuzzer_sys::fuzz_target;
use shared_policy::{Evaluator, Host, PolicyFile, Reason, path_is_ambiguous};

fn policy_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        dir.join(format!("daiv-fuzz-policy-{}.json", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let (json, mut rest) = split_once(data, 0);
    let mut queries = Vec::new();
    while queries.len() < 4 {
        let (host, r) = split_once(rest, 0);
        let (method, r) = split_once(r, 0);
        let (path, r) = split_once(r, 0);
        let host = String::from_utf8_lossy(host).into_owned();
        let method = String::from_utf8_lossy(method).into_owned();
        let path = String::from_utf8_lossy(path).into_owned();
        queries.push((host, method, path));
        rest = r;
        if rest.is_empty() {
            break;
        }
    }

    let path = policy_path();
    std::fs::write(path, json).expect("write the policy file");
    let loaded = policy_store::load(path);
    let direct = Evaluator::from_json(json);
    assert_eq!(
        loaded.is_deny_all(),
        direct.is_err(),
        "loader and parser disagree"
    );

    let hosts: Vec<Host> = queries
        .iter()
        .filter_map(|(h, _, _)| Host::parse_authority(h).ok().map(|(h, _)| h))
        .chain(["github.com", "10.0.0.1"].map(|h| Host::parse(h).expect("host")))
        .collect();
    let methods: Vec<&str> = queries
        .iter()
        .map(|(_, m, _)| m.as_str())
        .chain(["GET"])
        .collect();
    let paths: Vec<Option<&str>> = queries
        .iter()
        .map(|(_, _, p)| Some(p.as_str()))
        .chain([None])
        .collect();

    let Ok(ev) = direct else {
        // Rejected: deny-all, fail closed, whatever is asked.
        assert!(!loaded.is_shadow() && loaded.version().is_none());
        for host in &hosts {
            let c = loaded.decide_connect(host);
            assert!(!c.allowed && c.reason == Reason::PolicyUnavailable, "{c:?}");
            for method in &methods {
                for p in &paths {
                    let d = loaded.decide_http(host, method, *p);
                    assert!(!d.allowed && d.reason == Reason::PolicyUnavailable, "{d:?}");
                    assert!(d.inject.is_none());
                }
            }
        }
        return;
    };
    let file: PolicyFile = serde_json::from_slice(json).expect("a loadable policy parses");
    shared_policy::validate(&file).expect("a loadable policy validates");
    if shared_policy::validate_for_api(&file).is_ok() {
        assert!(!ev.is_shadow());
    }
    let _ = shared_policy::warnings(&file);
    // Re-read from its own serialisation (what the control plane writes): the same policy.
    let text = serde_json::to_vec(&file).expect("serialise");
    let again = Evaluator::from_json(&text).expect("a serialised valid policy loads");
    let reparsed: PolicyFile = serde_json::from_slice(&text).expect("reparse");
    assert_eq!(reparsed, file, "serialisation round trip");
    assert_eq!(reparsed.content(), file.content());

    for host in &hosts {
        let c = ev.decide_connect(host);
        assert_eq!(c, ev.decide_connect(host), "connect not deterministic");
        assert_eq!(c, loaded.decide_connect(host));
        assert_eq!(c, again.decide_connect(host));
        assert!(c.reason != Reason::PolicyUnavailable);
        for method in &methods {
            for p in &paths {
                let d = ev.decide_http(host, method, *p);
                assert_eq!(
                    d,
                    ev.decide_http(host, method, *p),
                    "request not deterministic"
                );
                assert_eq!(d, loaded.decide_http(host, method, *p));
                assert_eq!(d, again.decide_http(host, method, *p));
                if d.allowed {
                    assert!(
                        c.allowed,
                        "request allowed but CONNECT denied: {host} {method} {p:?}"
                    );
                }
                if let Some(inject) = &d.inject {
                    assert!(d.allowed);
                    let declared = file
                        .secrets
                        .values()
                        .any(|s| s.header == inject.header && s.value == inject.value);
                    assert!(declared, "injected a credential the file does not declare");
                    assert!(
                        c.intercept,
                        "credential on a tunnel that is not intercepted"
                    );
                }
                if p.is_some_and(path_is_ambiguous) {
                    assert_eq!(d, ev.decide_http(host, method, None));
                }
                if p.is_none() {
                    assert_eq!(d, ev.decide_request(host, method));
                }
            }
        }
    }
});
