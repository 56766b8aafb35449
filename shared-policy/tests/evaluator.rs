//! Table tests over `tests/fixtures/*.json` (smokescreen-style: fixture, host, method, decision,
//! reason), the broken fixtures, the API-only check, and the committed JSON Schema.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use shared_policy::{
    Evaluator, Host, PolicyError, PolicyFile, Reason, validate, validate_for_api, warnings,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn load(name: &str) -> Evaluator {
    let bytes = std::fs::read(fixture(name)).expect("fixture readable");
    Evaluator::from_json(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn host(s: &str) -> Host {
    Host::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// (fixture, host, method or "CONNECT", allowed, reason, rule, intercept (CONNECT only), injected header)
type Case = (
    &'static str,
    &'static str,
    &'static str,
    bool,
    Reason,
    Option<usize>,
    bool,
    Option<&'static str>,
);

const CASES: &[Case] = &[
    // allowlist: CONNECT is reachability only, any listed rule opens the tunnel.
    (
        "allowlist.json",
        "api.github.com",
        "CONNECT",
        true,
        Reason::RuleAllowed,
        Some(0),
        true,
        None,
    ),
    (
        "allowlist.json",
        "API.GitHub.com.",
        "CONNECT",
        true,
        Reason::RuleAllowed,
        Some(0),
        true,
        None,
    ),
    (
        "allowlist.json",
        "evil.com",
        "CONNECT",
        false,
        Reason::HostNotListed,
        None,
        false,
        None,
    ),
    // `*.github.com` matches neither the apex nor a look-alike.
    (
        "allowlist.json",
        "github.com",
        "CONNECT",
        false,
        Reason::HostNotListed,
        None,
        false,
        None,
    ),
    (
        "allowlist.json",
        "evilgithub.com",
        "CONNECT",
        false,
        Reason::HostNotListed,
        None,
        false,
        None,
    ),
    // Methods are upper-cased on read; the first host+method rule allows and injects.
    (
        "allowlist.json",
        "api.github.com",
        "GET",
        true,
        Reason::RuleAllowed,
        Some(0),
        false,
        Some("Authorization"),
    ),
    (
        "allowlist.json",
        "api.github.com",
        "get",
        true,
        Reason::RuleAllowed,
        Some(0),
        false,
        Some("Authorization"),
    ),
    // A later rule for the same host can permit another method, without the first rule's credential.
    (
        "allowlist.json",
        "api.github.com",
        "DELETE",
        true,
        Reason::RuleAllowed,
        Some(1),
        false,
        None,
    ),
    // Method denial reports the first host-matching rule.
    (
        "allowlist.json",
        "api.github.com",
        "PUT",
        false,
        Reason::MethodNotAllowed,
        Some(0),
        false,
        None,
    ),
    (
        "allowlist.json",
        "raw.github.com",
        "PATCH",
        false,
        Reason::MethodNotAllowed,
        Some(0),
        false,
        None,
    ),
    // credentialed: a plain `*` rule is tunnelled, a restricted or injecting one intercepted.
    (
        "allowlist.json",
        "packages.example.org",
        "CONNECT",
        true,
        Reason::RuleAllowed,
        Some(2),
        false,
        None,
    ),
    (
        "allowlist.json",
        "packages.example.org",
        "DELETE",
        true,
        Reason::RuleAllowed,
        Some(2),
        false,
        None,
    ),
    (
        "allowlist.json",
        "tunnelled.test",
        "CONNECT",
        true,
        Reason::RuleAllowed,
        Some(5),
        false,
        None,
    ),
    // IDNA: the rule and the host are both compared as punycode.
    (
        "allowlist.json",
        "xn--bcher-kva.example",
        "CONNECT",
        true,
        Reason::RuleAllowed,
        Some(3),
        false,
        None,
    ),
    (
        "allowlist.json",
        "BÜCHER.example",
        "GET",
        true,
        Reason::RuleAllowed,
        Some(3),
        false,
        None,
    ),
    // IP literal rules.
    (
        "allowlist.json",
        "10.0.0.5",
        "GET",
        true,
        Reason::RuleAllowed,
        Some(4),
        false,
        None,
    ),
    (
        "allowlist.json",
        "10.0.0.6",
        "GET",
        false,
        Reason::HostNotListed,
        None,
        false,
        None,
    ),
    // denylist: unlisted hosts are allowed and intercepted (intercept = all).
    (
        "denylist.json",
        "anything.test",
        "CONNECT",
        true,
        Reason::DefaultAllow,
        None,
        true,
        None,
    ),
    (
        "denylist.json",
        "anything.test",
        "DELETE",
        true,
        Reason::DefaultAllow,
        None,
        false,
        None,
    ),
    // A listed host's method restriction applies even under default allow.
    (
        "denylist.json",
        "readonly.test",
        "GET",
        true,
        Reason::RuleAllowed,
        Some(0),
        false,
        None,
    ),
    (
        "denylist.json",
        "readonly.test",
        "PUT",
        true,
        Reason::RuleAllowed,
        Some(1),
        false,
        None,
    ),
    (
        "denylist.json",
        "readonly.test",
        "POST",
        false,
        Reason::MethodNotAllowed,
        Some(0),
        false,
        None,
    ),
    (
        "denylist.json",
        "readonly.test",
        "CONNECT",
        true,
        Reason::RuleAllowed,
        Some(0),
        true,
        None,
    ),
    (
        "denylist.json",
        "a.internal.test",
        "GET",
        true,
        Reason::RuleAllowed,
        Some(2),
        false,
        Some("PRIVATE-TOKEN"),
    ),
    (
        "denylist.json",
        "a.internal.test",
        "POST",
        false,
        Reason::MethodNotAllowed,
        Some(2),
        false,
        None,
    ),
    // Defaults: deny, intercept all, methods ["*"], secrets null.
    (
        "defaults.json",
        "a.test",
        "CONNECT",
        true,
        Reason::RuleAllowed,
        Some(0),
        true,
        None,
    ),
    (
        "defaults.json",
        "a.test",
        "PATCH",
        true,
        Reason::RuleAllowed,
        Some(0),
        false,
        None,
    ),
    (
        "defaults.json",
        "b.test",
        "GET",
        false,
        Reason::HostNotListed,
        None,
        false,
        None,
    ),
    // Deny-default with no rules is a valid file (the API refuses it, the gateway denies all).
    (
        "empty_deny.json",
        "a.test",
        "CONNECT",
        false,
        Reason::HostNotListed,
        None,
        false,
        None,
    ),
];

#[test]
fn decision_table() {
    for &(file, h, method, allowed, reason, rule, intercept, inject) in CASES {
        let ev = load(file);
        let case = format!("{file} {method} {h}");
        if method == "CONNECT" {
            let d = ev.decide_connect(&host(h));
            assert_eq!(
                (d.allowed, d.reason, d.rule, d.intercept),
                (allowed, reason, rule, intercept),
                "{case}"
            );
        } else {
            let d = ev.decide_request(&host(h), method);
            assert_eq!(
                (d.allowed, d.reason, d.rule),
                (allowed, reason, rule),
                "{case}"
            );
            assert_eq!(
                d.inject.as_ref().map(|i| i.header.as_str()),
                inject,
                "{case}"
            );
        }
    }
}

#[test]
fn injection_carries_the_secret_value() {
    let d = load("allowlist.json").decide_request(&host("api.github.com"), "POST");
    let inject = d.inject.expect("injects");
    assert_eq!(inject.value.expose(), "Bearer ghp_fixture");
    // Redacted in Debug and Display.
    assert!(!format!("{inject:?}").contains("ghp_fixture"));
    assert_eq!(inject.value.to_string(), "***");
}

#[test]
fn broken_fixtures_are_refused() {
    let dir = fixture("broken");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("broken fixtures dir") {
        let path = entry.expect("dir entry").path();
        let bytes = std::fs::read(&path).expect("readable");
        let err = Evaluator::from_json(&bytes).expect_err(&path.display().to_string());
        // No message ever echoes a secret value.
        assert!(
            !err.to_string().contains("Injected"),
            "{}: {err}",
            path.display()
        );
        seen += 1;
    }
    assert!(seen >= 15);
}

#[test]
fn errors_name_the_field() {
    let cases = [
        ("broken/empty_methods.json", "policy.rules[0].methods"),
        (
            "broken/unknown_secret.json",
            "policy.rules[0].inject: no secret named \"nope\"",
        ),
        ("broken/bad_header_name.json", "secrets.s.header"),
        ("broken/crlf_value.json", "secrets.s.value"),
        ("broken/empty_host.json", "policy.rules[0].host"),
        ("broken/alternation_glob.json", "policy.rules[0].host"),
        ("broken/unknown_default.json", "unknown variant `…`"),
        (
            "broken/port_in_host.json",
            "policy.rules[1].host: must not include a port",
        ),
        ("broken/bracket_not_ipv6.json", "policy.rules[0].host"),
    ];
    for (file, want) in cases {
        let err =
            Evaluator::from_json(&std::fs::read(fixture(file)).expect("readable")).expect_err(file);
        assert!(err.to_string().contains(want), "{file}: {err}");
    }
}

#[test]
fn json_errors_do_not_echo_strings() {
    let err = Evaluator::from_json(br#"{"secrets": {"s": {"header": "X", "value": ["tok-123"]}}}"#);
    assert!(matches!(err, Err(PolicyError::Parse(_))));
    let err = Evaluator::from_json(br#"{"secrets": {"s": "tok-123"}}"#).expect_err("not a map");
    assert!(!err.to_string().contains("tok-123"), "{err}");
}

#[test]
fn api_refuses_deny_default_without_rules() {
    let file: PolicyFile =
        serde_json::from_slice(&std::fs::read(fixture("empty_deny.json")).expect("read"))
            .expect("parse");
    assert_eq!(validate_for_api(&file), Err(PolicyError::NothingReachable));
    let allow: PolicyFile =
        serde_json::from_str(r#"{"policy": {"default": "allow"}}"#).expect("parse");
    assert_eq!(validate_for_api(&allow), Ok(()));
}

#[test]
fn deny_all_denies_everything() {
    let ev = Evaluator::deny_all();
    assert!(ev.is_deny_all());
    let c = ev.decide_connect(&host("a.test"));
    assert!(!c.allowed);
    assert_eq!(c.reason.code(), "policy-unavailable");
    assert!(!ev.decide_request(&host("a.test"), "GET").allowed);
}

#[test]
fn secret_values_round_trip_for_the_writer() {
    let file: PolicyFile =
        serde_json::from_slice(&std::fs::read(fixture("allowlist.json")).expect("read"))
            .expect("parse");
    let text = serde_json::to_string(&file).expect("serialise");
    assert!(
        text.contains("Bearer ghp_fixture"),
        "the control plane writes real values"
    );
    assert!(
        !format!("{file:?}").contains("ghp_fixture"),
        "Debug redacts"
    );
}

#[test]
fn check_warns_about_broad_globs() {
    let file: PolicyFile = serde_json::from_str(
        r#"{"policy": {"rules": [{"host": "*github.com"}, {"host": "*.gitlab.com"}, {"host": "gitlab.com"}, {"host": "*.example.com"}]},
            "secrets": {"unused": {"header": "X-A", "value": "v"}}}"#,
    )
    .expect("parse");
    let w = warnings(&file).join("\n");
    assert!(w.contains("\"*github.com\" is broader"), "{w}");
    assert!(!w.contains("*.gitlab.com"), "{w}");
    assert!(
        w.contains("\"*.example.com\" does not match \"example.com\""),
        "{w}"
    );
    assert!(w.contains("secrets.unused"), "{w}");
}

fn policy(rules: serde_json::Value) -> Result<Evaluator, PolicyError> {
    let doc = serde_json::json!({"policy": {"default": "allow", "rules": rules}});
    Evaluator::from_json(doc.to_string().as_bytes())
}

/// A rule names its host in any spelling the host is normalised from. Found by
/// fuzz/fuzz_targets/host.rs: `s0a。` (an ideographic full stop, which IDNA maps to `.`) was the
/// host `s0a` but the glob `s0a.`, so under default allow the rule's method restriction never
/// applied; and `a..` normalised to the host `a`.
#[test]
fn rules_match_hosts_spelled_with_other_full_stops() {
    for rule in [
        "s0a\u{3002}",
        "b\u{fc}cher\u{3002}example\u{ff0e}",
        "a\u{3002}b",
    ] {
        let ev = policy(serde_json::json!([{"host": rule, "methods": ["GET"]}])).expect(rule);
        let host = Host::parse(rule).expect(rule);
        let get = ev.decide_http(&host, "GET", Some("/"));
        assert_eq!(
            (get.allowed, get.reason),
            (true, Reason::RuleAllowed),
            "{rule}"
        );
        let post = ev.decide_http(&host, "POST", Some("/"));
        assert_eq!(
            post.reason,
            Reason::MethodNotAllowed,
            "{rule}: the restriction applies"
        );
    }
    assert!(Host::parse("a..").is_err());
}

/// An IPv6 rule is an address, not a glob: `[2001:db8::1]` as a glob is a character class that
/// matches nothing, which under default allow silently dropped its method restriction.
#[test]
fn ip_literal_rules_match_as_addresses() {
    for rule in [
        "[2001:db8::1]",
        "2001:db8::1",
        "2001:DB8:0:0::1",
        "[2001:0db8::0001]",
    ] {
        let ev = policy(serde_json::json!([{"host": rule, "methods": ["GET"]}]))
            .unwrap_or_else(|e| panic!("{rule}: {e}"));
        for spelling in ["[2001:db8::1]", "2001:0DB8::1", "[2001:db8:0:0:0:0:0:1]"] {
            let h = host(spelling);
            let get = ev.decide_request(&h, "GET");
            assert_eq!(
                (get.allowed, get.rule),
                (true, Some(0)),
                "{rule} {spelling}"
            );
            let post = ev.decide_request(&h, "POST");
            assert_eq!(
                (post.allowed, post.reason),
                (false, Reason::MethodNotAllowed),
                "{rule} {spelling}: the restriction applies"
            );
            assert!(
                ev.decide_connect(&h).intercept,
                "{rule}: restricted, so intercepted"
            );
        }
        let other = ev.decide_request(&host("2001:db8::2"), "POST");
        assert_eq!(other.reason, Reason::DefaultAllow, "{rule}");
    }
    // IPv4, and an IPv4-mapped IPv6 rule: the same address as the IPv4 host.
    for rule in ["10.0.0.5", "::ffff:10.0.0.5", "[::ffff:10.0.0.5]"] {
        let ev = policy(serde_json::json!([{"host": rule, "methods": ["GET"]}])).expect(rule);
        for spelling in ["10.0.0.5", "[::ffff:10.0.0.5]"] {
            assert_eq!(
                ev.decide_request(&host(spelling), "POST").reason,
                Reason::MethodNotAllowed,
                "{rule} {spelling}"
            );
        }
        assert_eq!(
            ev.decide_request(&host("10.0.0.50"), "POST").reason,
            Reason::DefaultAllow,
            "{rule}: exact, not a prefix"
        );
    }
    // Character classes without a colon stay globs.
    let ev = policy(serde_json::json!([{"host": "[ab].test", "methods": ["GET"]}])).expect("class");
    assert!(!ev.decide_request(&host("a.test"), "POST").allowed);
}

#[test]
fn ports_in_host_rules_are_refused() {
    for (rule, want) in [
        ("api.example.com:443", "must not include a port"),
        ("*.example.com:443", "must not include a port"),
        ("10.0.0.5:80", "must not include a port"),
        ("example.com:*", "must not include a port"),
        ("[2001:db8::1]:443", "must not include a port"),
        ("[2001:db8::zz]", "must be an IPv6 address"),
    ] {
        let err = policy(serde_json::json!([{"host": "ok.test"}, {"host": rule}]))
            .expect_err(rule)
            .to_string();
        assert!(err.starts_with("policy.rules[1].host: "), "{rule}: {err}");
        assert!(err.contains(want), "{rule}: {err}");
    }
    // The API's validation refuses them too, without echoing secret values.
    let file: PolicyFile = serde_json::from_value(serde_json::json!({
        "policy": {"rules": [{"host": "api.example.com:443", "inject": "s"}]},
        "secrets": {"s": {"header": "Authorization", "value": "Bearer tok-999"}}
    }))
    .expect("parse");
    let err = validate_for_api(&file).expect_err("port").to_string();
    assert!(
        err.contains("policy.rules[0].host") && !err.contains("tok-999"),
        "{err}"
    );
}

#[test]
fn check_warns_about_globs_that_never_match() {
    let dead = [
        (".example.com", "starts with a dot"),
        ("example.com..", "empty label"),
        ("a..b.test", "empty label"),
        ("exa$mple.com", "'$'"),
        ("*.exa+mple.com", "'+'"),
        ("127.1", "all-numeric"),
        ("10.0.0.256", "all-numeric"),
        ("2001:db8:::1", "not a valid host"),
    ];
    let live = [
        "GitHub.COM",
        "example.com.",
        "*.example.com",
        "Bücher.example",
        "under_score.test",
        "[a-z]*.test",
        "[!x].test",
        "2001:db8::*",
        "*",
        "[2001:db8::1]",
    ];
    let rules: Vec<_> = dead
        .iter()
        .map(|(h, _)| *h)
        .chain(live)
        .map(|h| serde_json::json!({"host": h}))
        .collect();
    let file: PolicyFile =
        serde_json::from_value(serde_json::json!({"policy": {"rules": rules}})).expect("parse");
    shared_policy::validate(&file).expect("valid: these are warnings, not errors");
    let w = warnings(&file);
    for (index, (glob, why)) in dead.iter().enumerate() {
        let line = w
            .iter()
            .find(|l| l.starts_with(&format!("policy.rules[{index}].host ")))
            .unwrap_or_else(|| panic!("{glob}: no warning in {w:#?}"));
        assert!(
            line.contains("can never match") && line.contains(why),
            "{glob}: {line}"
        );
    }
    for (offset, glob) in live.iter().enumerate() {
        let index = dead.len() + offset;
        assert!(
            !w.iter()
                .any(|l| l.starts_with(&format!("policy.rules[{index}].host "))
                    && l.contains("can never match")),
            "{glob}: {w:#?}"
        );
    }
}

#[test]
fn committed_schema_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy.schema.json");
    let generated = shared_policy::json_schema();
    if std::env::var_os("UPDATE_SCHEMA").is_some() {
        std::fs::write(&path, &generated).expect("write schema");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "shared-policy/policy.schema.json is stale; regenerate with \
         `UPDATE_SCHEMA=1 cargo test -p shared-policy --test evaluator committed_schema_is_current`"
    );
}

proptest! {
    /// Arbitrary bytes never panic the parser; any Ok has passed validation.
    #[test]
    fn parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = Evaluator::from_json(&bytes);
    }

    /// Structured but random files: whatever the parser accepts can answer decisions, and
    /// every error has a message.
    #[test]
    fn random_policies_are_either_valid_or_explained(
        default in prop_oneof!["deny", "allow", "bogus"],
        host_glob in "[a-z*?\\[\\] .{}]{0,12}",
        methods in proptest::collection::vec("[A-Za-z* ]{0,6}", 0..3),
        inject in proptest::option::of("[a-z]{1,3}"),
        header in "[A-Za-z: -]{0,8}",
        value in "[a-z\r\n\0]{0,6}",
    ) {
        let doc = serde_json::json!({
            "policy": {"default": default, "rules": [{"host": host_glob, "methods": methods, "inject": inject}]},
            "secrets": {"abc": {"header": header, "value": value}},
        });
        match Evaluator::from_json(doc.to_string().as_bytes()) {
            Ok(ev) => { let _ = ev.decide_request(&host("a.test"), "GET"); }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}

// === path rules, shadow mode, versions ===

fn path_policy() -> Evaluator {
    Evaluator::from_json(
        serde_json::json!({
            "policy": {"default": "deny", "rules": [
                {"host": "gitlab.test", "methods": ["GET", "POST"], "paths": ["/api/v4/projects/**", "/api/v4/user"], "inject": "t"},
                {"host": "gitlab.test", "methods": ["GET"]},
                {"host": "docs.test", "paths": ["/guide/*"]}
            ]},
            "secrets": {"t": {"header": "PRIVATE-TOKEN", "value": "glpat"}}
        })
        .to_string()
        .as_bytes(),
    )
    .expect("valid")
}

#[test]
fn path_rules_scope_the_rule_and_its_credential() {
    let ev = path_policy();
    let gl = host("gitlab.test");
    let d = ev.decide_http(&gl, "POST", Some("/api/v4/projects/42/merge_requests"));
    assert!(d.allowed);
    assert_eq!(d.rule, Some(0));
    assert_eq!(d.inject.map(|i| i.header), Some("PRIVATE-TOKEN".to_owned()));
    assert!(
        ev.decide_http(&gl, "GET", Some("/api/v4/user"))
            .inject
            .is_some()
    );
    // Another path: the general rule allows GET, without the credential.
    let d = ev.decide_http(&gl, "GET", Some("/api/v4/users"));
    assert!(
        d.allowed && d.inject.is_none() && d.rule == Some(1),
        "{d:?}"
    );
    // POST elsewhere: permitted by rule 0's methods but not on this path.
    let d = ev.decide_http(&gl, "POST", Some("/api/v4/users"));
    assert_eq!(
        (d.allowed, d.reason, d.rule),
        (false, Reason::PathNotAllowed, Some(0))
    );
    assert_eq!(d.reason.code(), "path-not-allowed");
    // Unknown path: path rules do not apply.
    assert_eq!(
        ev.decide_request(&gl, "POST").reason,
        Reason::PathNotAllowed
    );
    // `*` stays within one segment.
    let docs = host("docs.test");
    assert!(ev.decide_http(&docs, "GET", Some("/guide/intro")).allowed);
    assert!(!ev.decide_http(&docs, "GET", Some("/guide/a/b")).allowed);
    // Paths force interception: a tunnel could not check them.
    assert!(ev.decide_connect(&docs).intercept);
}

#[test]
fn ambiguous_paths_never_match_a_path_rule() {
    let ev = path_policy();
    let gl = host("gitlab.test");
    for path in [
        "/api/v4/projects/../users",
        "/api/v4/projects/%2e%2E/users",
        "/api/v4/projects/..;/users",
        "/api/v4/projects/x%2F..%2Fusers",
        "/api/v4/projects//x",
        "/api/v4/projects/x\\..\\users",
        "/api/v4/projects/./x",
    ] {
        let d = ev.decide_http(&gl, "POST", Some(path));
        assert!(!d.allowed, "{path} must not match a path rule: {d:?}");
        assert!(shared_policy::path_is_ambiguous(path), "{path}");
    }
    assert!(!shared_policy::path_is_ambiguous(
        "/api/v4/projects/a.b/..x"
    ));
}

#[test]
fn path_globs_are_validated_and_warned_about() {
    for (paths, needle) in [
        (serde_json::json!([]), "must not be empty"),
        (serde_json::json!(["api/*"]), "must start with"),
        (serde_json::json!(["/a b"]), "whitespace"),
        (serde_json::json!(["/{a,b}"]), "must not contain"),
        (serde_json::json!(["/a#b"]), "must not contain"),
    ] {
        let err =
            policy(serde_json::json!([{"host": "a.test", "paths": paths}])).expect_err("refused");
        let text = err.to_string();
        assert!(
            text.starts_with("policy.rules[0].paths:") && text.contains(needle),
            "{text}"
        );
    }
    let file: PolicyFile = serde_json::from_value(serde_json::json!({
        "policy": {"rules": [{"host": "a.test", "paths": ["/api/*"]}]}
    }))
    .expect("parse");
    assert!(
        warnings(&file).iter().any(|w| w.contains("/api/**")),
        "{:?}",
        warnings(&file)
    );
}

#[test]
fn shadow_mode_is_read_but_refused_by_the_api() {
    let file: PolicyFile = serde_json::from_value(serde_json::json!({
        "policy": {"mode": "shadow", "rules": [{"host": "a.test"}]}
    }))
    .expect("parse");
    assert!(
        Evaluator::from_file_model(file.clone())
            .expect("valid")
            .is_shadow()
    );
    assert_eq!(validate_for_api(&file), Err(PolicyError::ShadowNotAllowed));
    assert!(!Evaluator::deny_all().is_shadow());
    assert!(!load("allowlist.json").is_shadow());
}

#[test]
fn the_content_excludes_the_version_label() {
    let a: PolicyFile =
        serde_json::from_value(serde_json::json!({"policy": {"rules": [{"host": "a.test"}]}}))
            .expect("parse");
    let mut b = a.clone();
    b.policy.rules[0].host = "b.test".into();
    assert_ne!(a.content(), b.content());
    let labelled = a.clone().with_version("v-1");
    assert_eq!(labelled.content(), a.content(), "the label is not content");
    let text = serde_json::to_vec(&labelled).expect("json");
    let ev = Evaluator::from_json(&text).expect("valid");
    assert_eq!(ev.version(), Some("v-1"));
    // Without a version field nothing is written, so older readers see the same file.
    assert!(!String::from_utf8_lossy(&serde_json::to_vec(&a).expect("json")).contains("version"));
}

/// A secret value the gateway could not send as a header is refused when the policy is read
/// (a 422 at the API), not at every request; the message never echoes the value.
#[test]
fn secret_values_must_be_header_values() {
    let with = |value: &str| -> PolicyFile {
        serde_json::from_value(serde_json::json!({
            "policy": {"rules": [{"host": "a.test", "inject": "t"}]},
            "secrets": {"t": {"header": "Authorization", "value": value}}
        }))
        .expect("parse")
    };
    for bad in [
        "tok\u{1}en-s3cr3t",
        "tok\u{7f}en-s3cr3t",
        "tok\u{b}en-s3cr3t",
        "tok\ren-s3cr3t",
        "tok\nen-s3cr3t",
        "tok\u{0}en-s3cr3t",
        "tok\u{1b}[0men-s3cr3t",
    ] {
        let err = validate(&with(bad)).expect_err(bad);
        assert!(
            matches!(err, PolicyError::InvalidHeaderValue { .. }),
            "{err}"
        );
        let text = err.to_string();
        assert!(text.starts_with("secrets.t.value: "), "{text}");
        assert!(!text.contains("s3cr3t") && !text.contains("tok"), "{text}");
        assert!(Evaluator::from_json(&serde_json::to_vec(&with(bad)).expect("json")).is_err());
    }
    for good in ["Bearer ghp_x", "a\tb", "tökén", " spaced ", ""] {
        assert_eq!(validate(&with(good)), Ok(()), "{good:?}");
    }
}
