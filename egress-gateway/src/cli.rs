//! Operator subcommands. Each writes human-readable text to the given writer and returns the
//! process exit code, so tests run them without spawning the binary.

use std::io::Write;
use std::path::Path;

use shared_policy::{Evaluator, Host, PolicyFile, validate, validate_for_api, warnings};

use crate::ca;

/// `policy check FILE`: 0 when the gateway would enforce the file, 1 when it would deny all.
pub fn policy_check(file: &Path, api: bool, out: &mut dyn Write) -> std::io::Result<i32> {
    let parsed = match read_policy(file) {
        Ok(p) => p,
        Err(msg) => {
            writeln!(out, "error: {msg}")?;
            writeln!(
                out,
                "{}: INVALID (the gateway would deny all egress)",
                file.display()
            )?;
            return Ok(1);
        }
    };
    let checked = if api {
        validate_for_api(&parsed)
    } else {
        validate(&parsed)
    };
    if let Err(e) = checked {
        writeln!(out, "error: {e}")?;
        writeln!(
            out,
            "{}: INVALID (the gateway would deny all egress)",
            file.display()
        )?;
        return Ok(1);
    }
    for w in warnings(&parsed) {
        writeln!(out, "warning: {w}")?;
    }
    writeln!(
        out,
        "{}: OK ({} rule(s), {} secret(s), default {:?}, intercept {:?})",
        file.display(),
        parsed.policy.rules.len(),
        parsed.secrets.len(),
        parsed.policy.default,
        parsed.policy.intercept
    )?;
    Ok(0)
}

/// What `policy explain` is asked about.
#[derive(Debug, Clone, Copy)]
pub struct Query<'a> {
    /// Destination host (a port is ignored).
    pub host: &'a str,
    /// HTTP method.
    pub method: &'a str,
    /// Request path, if given.
    pub path: Option<&'a str>,
    /// As a `--shadow` gateway.
    pub shadow: bool,
}

/// `policy explain FILE --host H --method M [--path P] [--shadow]`: both decisions (CONNECT
/// and the request) and why.
pub fn policy_explain(file: &Path, q: &Query<'_>, out: &mut dyn Write) -> std::io::Result<i32> {
    let Query {
        host,
        method,
        path,
        shadow,
    } = *q;
    let evaluator = match read_policy(file)
        .and_then(|p| Evaluator::from_file_model(p).map_err(|e| e.to_string()))
    {
        Ok(ev) => ev,
        Err(msg) => {
            writeln!(out, "error: {msg}")?;
            writeln!(
                out,
                "the gateway would deny all egress (reason: policy-unavailable)"
            )?;
            return Ok(1);
        }
    };
    let host = match Host::parse_authority(host) {
        Ok((h, _)) => h,
        Err(e) => {
            writeln!(out, "error: host {host:?}: {e}")?;
            return Ok(1);
        }
    };
    let rule = |i: Option<usize>| match i.and_then(|i| evaluator.rule_host(i).map(|h| (i, h))) {
        Some((i, h)) => match i.and_then_paths(&evaluator) {
            Some(paths) => format!("policy.rules[{i}] ({h:?}, paths {paths:?})"),
            None => format!("policy.rules[{i}] ({h:?})"),
        },
        None => "no rule".to_owned(),
    };
    let shadow = shadow || evaluator.is_shadow();
    // What the gateway does with a denial: report-only mode lets policy denials through.
    let verdict = |allowed: bool, reason: shared_policy::Reason| match (allowed, shadow) {
        (true, _) => "allow".to_owned(),
        (false, true) if reason != shared_policy::Reason::PolicyUnavailable => {
            "deny (shadow: reported, not enforced; the request goes through without credentials)"
                .to_owned()
        }
        (false, _) => "deny".to_owned(),
    };
    if shadow {
        writeln!(
            out,
            "mode: shadow (report-only): denials are audited with \"enforced\": false and let through"
        )?;
    }
    let c = evaluator.decide_connect(&host);
    writeln!(out, "host: {host}")?;
    writeln!(
        out,
        "CONNECT: {} ({}: {}), decided by {}; {}",
        verdict(c.allowed, c.reason),
        c.reason.code(),
        c.reason.describe(),
        rule(c.rule),
        if !c.allowed {
            "no tunnel"
        } else if c.intercept {
            "TLS intercepted (methods enforced, credentials injected)"
        } else {
            "tunnelled untouched"
        }
    )?;
    let r = evaluator.decide_http(&host, method, path);
    let method = method.to_ascii_uppercase();
    let target = match path {
        Some(p) => format!("{method} {p}"),
        None => method.clone(),
    };
    writeln!(
        out,
        "{target}: {} ({}: {}), decided by {}",
        verdict(r.allowed, r.reason),
        r.reason.code(),
        r.reason.describe(),
        rule(r.rule)
    )?;
    if let Some(inject) = &r.inject {
        writeln!(
            out,
            "injects header {:?} (value redacted), over TLS only",
            inject.header
        )?;
    }
    if path.is_none()
        && (0..)
            .map_while(|i| evaluator.rule_host(i))
            .enumerate()
            .any(|(i, _)| evaluator.rule_paths(i).is_some())
    {
        writeln!(
            out,
            "note: no --path given, so rules restricted to paths were not considered"
        )?;
    }
    if path.is_some_and(shared_policy::path_is_ambiguous) {
        writeln!(
            out,
            "note: this path is ambiguous (dot segments, encoded slashes or empty segments): no path rule matches it"
        )?;
    }
    if r.allowed && c.allowed && !c.intercept {
        writeln!(
            out,
            "note: tunnelled hosts are not inspected, so any method goes through the tunnel"
        )?;
    }
    Ok(0)
}

/// Path globs of a rule, for `explain`.
trait RulePaths {
    fn and_then_paths(self, ev: &Evaluator) -> Option<Vec<String>>;
}

impl RulePaths for usize {
    fn and_then_paths(self, ev: &Evaluator) -> Option<Vec<String>> {
        ev.rule_paths(self).map(<[String]>::to_vec)
    }
}

/// `health`: asks `GET /-/health/` of the gateway's health listener at `listen` until it answers
/// (and reports `expect` as its policy version, if given) or `timeout` passes. Prints the
/// version.
pub fn health(
    listen: std::net::SocketAddr,
    expect: Option<&str>,
    timeout: std::time::Duration,
    out: &mut dyn Write,
) -> std::io::Result<i32> {
    let mut addr = listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let deadline = std::time::Instant::now() + timeout;
    let mut last: String;
    loop {
        match probe(addr) {
            Ok(version) => {
                let shown = version.as_deref().unwrap_or("");
                if expect.is_none_or(|e| version.as_deref() == Some(e)) {
                    writeln!(out, "ok policy_version={shown}")?;
                    return Ok(0);
                }
                last = format!("enforces policy_version={shown}");
            }
            Err(e) => last = e.to_string(),
        }
        if std::time::Instant::now() >= deadline {
            writeln!(
                out,
                "error: gateway at {addr}: {last} (expected policy_version={})",
                expect.unwrap_or("any")
            )?;
            return Ok(1);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// One health request: `Ok(version)` on a 200.
fn probe(addr: std::net::SocketAddr) -> std::io::Result<Option<String>> {
    use std::io::Read;
    let step = std::time::Duration::from_secs(1);
    let mut tcp = std::net::TcpStream::connect_timeout(&addr, step)?;
    tcp.set_read_timeout(Some(step))?;
    tcp.set_write_timeout(Some(step))?;
    write!(
        tcp,
        "GET {} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n",
        crate::proxy::HEALTH_PATH
    )?;
    let mut text = String::new();
    tcp.take(16 * 1024).read_to_string(&mut text)?;
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.lines();
    let status_ok = lines
        .next()
        .is_some_and(|l| l.split_whitespace().nth(1) == Some("200"));
    if !status_ok {
        return Err(std::io::Error::other("health answered without 200"));
    }
    Ok(lines.find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case(crate::proxy::VERSION_HEADER)
            .then(|| value.trim().to_owned())
    }))
}

fn read_policy(file: &Path) -> Result<PolicyFile, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    // Go through the evaluator's parser so the messages are the gateway's own.
    Evaluator::from_json(&bytes).map_err(|e| e.to_string())?;
    serde_json::from_slice(&bytes).map_err(|e| e.to_string())
}

/// `gen-ca`: writes a new CA. The key file is created with mode 0600 before any byte is written.
pub fn gen_ca(
    cert_out: &Path,
    key_out: &Path,
    common_name: &str,
    force: bool,
    out: &mut dyn Write,
) -> std::io::Result<i32> {
    use std::os::unix::fs::OpenOptionsExt;
    let (cert, key) = match ca::generate_ca(common_name) {
        Ok(pair) => pair,
        Err(e) => {
            writeln!(out, "error: {e}")?;
            return Ok(1);
        }
    };
    let open = |path: &Path, mode: u32| {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).mode(mode);
        if force {
            opts.create(true).truncate(true);
        } else {
            opts.create_new(true);
        }
        opts.open(path)
    };
    let write = |path: &Path, mode: u32, text: &str| -> std::io::Result<()> {
        let mut f = open(path, mode)?;
        // An existing file keeps its mode under --force; tighten it for the key.
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()
    };
    for (path, mode, text) in [(key_out, 0o600, &key), (cert_out, 0o644, &cert)] {
        if let Err(e) = write(path, mode, text) {
            writeln!(out, "error: {}: {e}", path.display())?;
            return Ok(1);
        }
    }
    writeln!(
        out,
        "wrote CA certificate {} and key {} (mode 0600)",
        cert_out.display(),
        key_out.display()
    )?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(f: impl FnOnce(&mut Vec<u8>) -> std::io::Result<i32>) -> (i32, String) {
        let mut out = Vec::new();
        let code = f(&mut out).expect("io");
        (code, String::from_utf8_lossy(&out).into_owned())
    }

    #[test]
    fn check_and_explain() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("good.json");
        std::fs::write(
            &good,
            r#"{"policy": {"intercept": "credentialed", "rules": [{"host": "*github.com", "methods": ["GET"], "inject": "t"}, {"host": "pypi.org"}]},
                "secrets": {"t": {"header": "Authorization", "value": "Bearer sekrit"}}}"#,
        )
        .expect("write");
        let (code, text) = run(|o| policy_check(&good, false, o));
        assert_eq!(code, 0, "{text}");
        assert!(
            text.contains("warning:") && text.contains("*github.com"),
            "{text}"
        );

        let bad = dir.path().join("bad.json");
        std::fs::write(
            &bad,
            r#"{"policy": {"rules": [{"host": "a.test", "methods": []}]}}"#,
        )
        .expect("write");
        let (code, text) = run(|o| policy_check(&bad, false, o));
        assert_eq!(code, 1);
        assert!(text.contains("policy.rules[0].methods"), "{text}");
        let (code, _) = run(|o| policy_check(&dir.path().join("absent.json"), false, o));
        assert_eq!(code, 1);

        let q = |host, method| Query {
            host,
            method,
            path: None,
            shadow: false,
        };
        let (code, text) = run(|o| policy_explain(&good, &q("api.github.com:443", "post"), o));
        assert_eq!(code, 0);
        assert!(text.contains("CONNECT: allow"), "{text}");
        assert!(text.contains("POST: deny (method-not-allowed"), "{text}");
        let (_, text) = run(|o| policy_explain(&good, &q("api.github.com", "GET"), o));
        assert!(text.contains("injects header \"Authorization\""), "{text}");
        assert!(!text.contains("sekrit"), "{text}");
        let (_, text) = run(|o| policy_explain(&good, &q("pypi.org", "DELETE"), o));
        assert!(text.contains("tunnelled untouched"), "{text}");
        let (_, text) = run(|o| {
            policy_explain(
                &good,
                &Query {
                    shadow: true,
                    ..q("api.github.com", "POST")
                },
                o,
            )
        });
        assert!(
            text.contains("mode: shadow") && text.contains("POST: deny (shadow"),
            "{text}"
        );
    }

    #[test]
    fn explain_path_rules() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("p.json");
        std::fs::write(
            &file,
            r#"{"policy": {"rules": [{"host": "gitlab.test", "paths": ["/api/v4/projects/**"], "inject": "t"}, {"host": "gitlab.test", "methods": ["GET"]}]},
                "secrets": {"t": {"header": "PRIVATE-TOKEN", "value": "glpat-sekrit"}}}"#,
        )
        .expect("write");
        let q = |method, path| Query {
            host: "gitlab.test",
            method,
            path,
            shadow: false,
        };
        let (code, text) =
            run(|o| policy_explain(&file, &q("POST", Some("/api/v4/projects/1")), o));
        assert_eq!(code, 0, "{text}");
        assert!(text.contains("POST /api/v4/projects/1: allow"), "{text}");
        assert!(text.contains("paths [\"/api/v4/projects/**\"]"), "{text}");
        assert!(text.contains("injects header \"PRIVATE-TOKEN\""), "{text}");
        let (_, text) = run(|o| policy_explain(&file, &q("POST", Some("/api/v4/users")), o));
        assert!(text.contains("deny (path-not-allowed"), "{text}");
        let (_, text) = run(|o| policy_explain(&file, &q("POST", None), o));
        assert!(text.contains("no --path given"), "{text}");
        let (_, text) =
            run(|o| policy_explain(&file, &q("POST", Some("/api/v4/projects/../users")), o));
        assert!(
            text.contains("ambiguous") && text.contains("deny"),
            "{text}"
        );
        assert!(!text.contains("sekrit"));
        let (code, text) = run(|o| policy_check(&file, true, o));
        assert_eq!(code, 0, "{text}");
    }

    #[test]
    fn gen_ca_writes_a_usable_pair() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
        let (code, text) = run(|o| gen_ca(&cert, &key, "test", false, o));
        assert_eq!(code, 0, "{text}");
        let mode = std::fs::metadata(&key).expect("key").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        ca::CertificateAuthority::from_files(&cert, &key, provider).expect("loads");
        // Refuses to overwrite without --force.
        let (code, _) = run(|o| gen_ca(&cert, &key, "test", false, o));
        assert_eq!(code, 1);
        let (code, _) = run(|o| gen_ca(&cert, &key, "test", true, o));
        assert_eq!(code, 0);
    }
}
