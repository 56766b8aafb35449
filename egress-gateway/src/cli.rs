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

/// `policy explain FILE --host H --method M`: both decisions (CONNECT and the request) and why.
pub fn policy_explain(
    file: &Path,
    host: &str,
    method: &str,
    out: &mut dyn Write,
) -> std::io::Result<i32> {
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
        Some((i, h)) => format!("policy.rules[{i}] ({h:?})"),
        None => "no rule".to_owned(),
    };
    let c = evaluator.decide_connect(&host);
    writeln!(out, "host: {host}")?;
    writeln!(
        out,
        "CONNECT: {} ({}: {}), decided by {}; {}",
        if c.allowed { "allow" } else { "deny" },
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
    let r = evaluator.decide_request(&host, method);
    let method = method.to_ascii_uppercase();
    writeln!(
        out,
        "{method}: {} ({}: {}), decided by {}",
        if r.allowed { "allow" } else { "deny" },
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
    if r.allowed && c.allowed && !c.intercept {
        writeln!(
            out,
            "note: tunnelled hosts are not inspected, so any method goes through the tunnel"
        )?;
    }
    Ok(0)
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

        let (code, text) = run(|o| policy_explain(&good, "api.github.com:443", "post", o));
        assert_eq!(code, 0);
        assert!(text.contains("CONNECT: allow"), "{text}");
        assert!(text.contains("POST: deny (method-not-allowed"), "{text}");
        let (_, text) = run(|o| policy_explain(&good, "api.github.com", "GET", o));
        assert!(text.contains("injects header \"Authorization\""), "{text}");
        assert!(!text.contains("sekrit"), "{text}");
        let (_, text) = run(|o| policy_explain(&good, "pypi.org", "DELETE", o));
        assert!(text.contains("tunnelled untouched"), "{text}");
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
