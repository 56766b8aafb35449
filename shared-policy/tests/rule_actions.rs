//! `rules[].action`: `deny` rules (a denylist, an exception before a wildcard) and `credential`
//! rules (a credential that never widens what is reachable), and what validation refuses.

use shared_policy::{Evaluator, Host, PolicyError, PolicyFile, Reason, validate_for_api};

fn policy(json: serde_json::Value) -> Evaluator {
    Evaluator::from_json(json.to_string().as_bytes()).expect("valid policy")
}

fn host(s: &str) -> Host {
    Host::parse(s).expect("host")
}

fn secrets() -> serde_json::Value {
    serde_json::json!({
        "tok": {"header": "Authorization", "value": "Bearer vault-tok"},
        "own": {"header": "X-Own", "value": "own"}
    })
}

#[test]
fn a_deny_rule_refuses_its_host_under_default_allow() {
    let ev = policy(serde_json::json!({
        "policy": {"default": "allow", "rules": [{"host": "bad.example.test", "action": "deny"}]}
    }));
    let c = ev.decide_connect(&host("bad.example.test"));
    assert_eq!(
        (c.allowed, c.reason, c.rule),
        (false, Reason::RuleDenied, Some(0))
    );
    let r = ev.decide_request(&host("BAD.example.test."), "GET");
    assert_eq!((r.allowed, r.reason), (false, Reason::RuleDenied));
    assert_eq!(r.reason.code(), "rule-denied");
    // Anything else follows the default.
    assert!(ev.decide_connect(&host("good.example.test")).allowed);
    assert!(
        ev.decide_request(&host("good.example.test"), "DELETE")
            .allowed
    );
}

#[test]
fn the_first_deciding_rule_wins() {
    // An exception carved out of a wildcard, and an allow before a broader deny.
    let ev = policy(serde_json::json!({
        "policy": {"default": "deny", "rules": [
            {"host": "a.example.test"},
            {"host": "*.example.test", "action": "deny"},
            {"host": "b.other.test", "action": "deny"},
            {"host": "*.other.test"}
        ]}
    }));
    assert!(ev.decide_connect(&host("a.example.test")).allowed);
    assert!(ev.decide_request(&host("a.example.test"), "GET").allowed);
    assert!(!ev.decide_connect(&host("z.example.test")).allowed);
    assert_eq!(
        ev.decide_request(&host("b.other.test"), "GET").reason,
        Reason::RuleDenied
    );
    assert!(ev.decide_request(&host("c.other.test"), "GET").allowed);
}

#[test]
fn a_credential_rule_never_makes_a_host_reachable() {
    let ev = policy(serde_json::json!({
        "policy": {"default": "deny", "intercept": "credentialed", "rules": [
            {"host": "api.vault.test", "action": "credential", "inject": "tok"}
        ]},
        "secrets": secrets()
    }));
    let c = ev.decide_connect(&host("api.vault.test"));
    assert_eq!((c.allowed, c.reason), (false, Reason::HostNotListed));
    let r = ev.decide_request(&host("api.vault.test"), "GET");
    assert_eq!((r.allowed, r.inject), (false, None));
}

#[test]
fn a_credential_rule_injects_where_other_rules_allow() {
    let ev = policy(serde_json::json!({
        "policy": {"default": "deny", "intercept": "credentialed", "rules": [
            {"host": "api.vault.test", "action": "credential", "inject": "tok",
             "methods": ["GET", "POST"], "paths": ["/v1/**"]},
            {"host": "own.vault.test", "inject": "own"},
            {"host": "*.vault.test", "action": "credential", "inject": "tok"},
            {"host": "*.vault.test"},
            {"host": "plain.test"}
        ]},
        "secrets": secrets()
    }));
    // Intercepted so it can be injected; a host no credential rule matches is tunnelled.
    let c = ev.decide_connect(&host("api.vault.test"));
    assert_eq!((c.allowed, c.intercept), (true, true));
    assert!(!ev.decide_connect(&host("plain.test")).intercept);
    let r = ev.decide_http(&host("api.vault.test"), "post", Some("/v1/items"));
    assert_eq!(
        (r.allowed, r.reason, r.rule),
        (true, Reason::RuleAllowed, Some(3))
    );
    let inject = r.inject.expect("the credential rule injects");
    assert_eq!(
        (inject.header.as_str(), inject.value.expose()),
        ("Authorization", "Bearer vault-tok")
    );
    // Another path: the next credential rule matching (the wildcard's, every method and path).
    let other = ev.decide_http(&host("api.vault.test"), "GET", Some("/v2/items"));
    assert!(other.allowed);
    assert_eq!(
        other.inject.map(|i| i.value.expose().to_owned()),
        Some("Bearer vault-tok".to_owned())
    );
    // A deciding rule's own credential wins over a credential rule's.
    let own = ev.decide_http(&host("own.vault.test"), "GET", Some("/"));
    assert_eq!((own.allowed, own.rule), (true, Some(1)));
    assert_eq!(own.inject.map(|i| i.header), Some("X-Own".to_owned()));
}

#[test]
fn a_credential_rule_keeps_to_its_methods_and_paths() {
    let ev = policy(serde_json::json!({
        "policy": {"default": "deny", "rules": [
            {"host": "api.vault.test", "action": "credential", "inject": "tok",
             "methods": ["GET"], "paths": ["/v1/**"]},
            {"host": "*.vault.test"}
        ]},
        "secrets": secrets()
    }));
    let head = ev.decide_http(&host("api.vault.test"), "HEAD", Some("/v1/items"));
    assert_eq!((head.allowed, head.inject), (true, None));
    let other = ev.decide_http(&host("api.vault.test"), "GET", Some("/v2/items"));
    assert_eq!((other.allowed, other.inject), (true, None));
    let unknown_path = ev.decide_request(&host("api.vault.test"), "GET");
    assert_eq!((unknown_path.allowed, unknown_path.inject), (true, None));
    assert!(
        ev.decide_http(&host("api.vault.test"), "GET", Some("/v1/x"))
            .inject
            .is_some()
    );
}

#[test]
fn a_credential_rule_injects_under_default_allow() {
    let ev = policy(serde_json::json!({
        "policy": {"default": "allow", "intercept": "credentialed", "rules": [
            {"host": "api.vault.test", "action": "credential", "inject": "tok"}
        ]},
        "secrets": secrets()
    }));
    let c = ev.decide_connect(&host("api.vault.test"));
    assert_eq!((c.allowed, c.intercept), (true, true));
    let r = ev.decide_request(&host("api.vault.test"), "GET");
    assert_eq!(r.reason, Reason::DefaultAllow);
    assert_eq!(r.inject.map(|i| i.header), Some("Authorization".to_owned()));
}

#[test]
fn actions_that_do_not_fit_the_rule_are_refused() {
    let cases = [
        (
            serde_json::json!({"host": "a.test", "action": "deny", "inject": "tok"}),
            "a deny rule injects nothing",
        ),
        (
            serde_json::json!({"host": "a.test", "action": "deny", "paths": ["/x"]}),
            "a deny rule takes no paths",
        ),
        (
            serde_json::json!({"host": "a.test", "action": "deny", "methods": ["GET"]}),
            "methods must be [\"*\"]",
        ),
        (
            serde_json::json!({"host": "a.test", "action": "credential"}),
            "names the secret it injects",
        ),
    ];
    for (rule, want) in cases {
        let json = serde_json::json!({"policy": {"rules": [rule]}, "secrets": secrets()});
        let err = Evaluator::from_json(json.to_string().as_bytes()).expect_err(want);
        assert!(
            matches!(err, PolicyError::InvalidAction { index: 0, .. }),
            "{err}"
        );
        assert!(err.to_string().contains(want), "{err}");
    }
    let unknown = serde_json::json!({"policy": {"rules": [{"host": "a.test", "action": "maybe"}]}});
    assert!(Evaluator::from_json(unknown.to_string().as_bytes()).is_err());
}

#[test]
fn the_api_wants_a_rule_that_allows_and_no_door_state() {
    let only_denies: PolicyFile = serde_json::from_value(serde_json::json!({
        "policy": {"default": "deny", "rules": [{"host": "a.test", "action": "deny"}]}
    }))
    .expect("parse");
    assert_eq!(
        validate_for_api(&only_denies),
        Err(PolicyError::NothingReachable)
    );
    let door: PolicyFile = serde_json::from_value(serde_json::json!({
        "policy": {"default": "allow"}, "door": "anything"
    }))
    .expect("parse");
    assert_eq!(validate_for_api(&door), Err(PolicyError::DoorNotAllowed));
    // The door's state is redacted as a secret is.
    assert!(!format!("{door:?}").contains("anything"));
}

#[test]
fn an_allow_rule_is_written_as_before() {
    // Policies without actions serialise byte for byte as they did (their versions hold).
    let file: PolicyFile = serde_json::from_value(serde_json::json!({
        "policy": {"rules": [{"host": "a.test"}]}
    }))
    .expect("parse");
    let text = serde_json::to_string(&file).expect("serialise");
    assert!(!text.contains("action"), "{text}");
    assert!(!text.contains("door"), "{text}");
}
