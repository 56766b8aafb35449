//! OpenSandbox's egress through its SDK, unchanged: a sandbox created with a `networkPolicy`
//! reaches what it allows through its gateway, its policy is read and patched at the egress
//! endpoint, and a credential vault's binding injects a header that the fixture upstream
//! (an HTTPS echo under `.test`) sees and the sandbox never holds. Programs in
//! integration/python/opensandbox_egress.py, under runc and gVisor.

use std::path::PathBuf;

use anyhow::{Context, Result};
use e2e::egress::{EgressStack, Upstream};
use e2e::python::{drive_script, venv_python};
use e2e::{
    ControlPlane, DeploymentGuard, containers_but_workers, free_port, networks_with,
    volumes_but_shared_helper,
};
use serde_json::{Value, json};

const NEWEST: &str = "opensandbox-1.2.1";
const OLDEST: &str = "opensandbox-1.1.1";
const API: &str = "api.upstream.test";
const OTHER: &str = "other.upstream.test";

fn python(sdk: &str) -> PathBuf {
    venv_python(Some(sdk))
}

/// An egress stack whose service serves OpenSandbox's API; its `host:port`.
async fn stack(extra: &[(&str, &str)]) -> Result<(EgressStack, String)> {
    let port = free_port().to_string();
    let mut env: Vec<(&str, &str)> = vec![("OPENSANDBOX_PORT", &port)];
    env.extend_from_slice(extra);
    let stack = EgressStack::start_with(&env).await?;
    Ok((stack, format!("127.0.0.1:{port}")))
}

async fn drive(
    sdk: &str,
    cp: &ControlPlane,
    domain: &str,
    scenario: &str,
    params: Value,
) -> Result<Value> {
    let env = [
        ("OPEN_SANDBOX_DOMAIN", domain.to_string()),
        ("OPEN_SANDBOX_API_KEY", cp.key.clone()),
        ("OS_PARAMS", params.to_string()),
    ];
    let env = env.map(|(k, v)| (k.to_string(), v)).to_vec();
    drive_script(python(sdk), "opensandbox_egress.py", scenario, env).await
}

/// The `Authorization` the upstream saw on `path` (`None`: none; the request must have come).
fn authorization(up: &Upstream, path: &str) -> Result<Option<String>> {
    let seen = up
        .requests()?
        .into_iter()
        .rev()
        .find(|r| r["path"] == path)
        .with_context(|| format!("the upstream never saw {path}"))?;
    Ok(seen["headers"]["authorization"].as_str().map(str::to_owned))
}

/// No container, volume or network of the deployment's left (the gateway and its networks
/// go with the sandbox).
fn assert_nothing_left(cp: &ControlPlane) {
    let label = format!("daiv.sandbox.deployment={}", cp.deployment);
    let left = containers_but_workers(&[&label]);
    assert!(left.is_empty(), "containers left: {left:?}");
    let volumes = volumes_but_shared_helper(&[&label]);
    assert!(volumes.is_empty(), "volumes left: {volumes:?}");
    let networks = networks_with(&[&label]);
    assert!(networks.is_empty(), "networks left: {networks:?}");
}

/// The vault scenario with `sdk`, and what the test asserts of it; `tag` keeps paths apart.
async fn vault_turn(sdk: &str, stack: &EgressStack, domain: &str, tag: &str) -> Result<()> {
    let (up, cp) = (&stack.up, &stack.cp);
    let secret = format!("os-vault-{tag}-0123456789abcdef");
    let rotated = format!("os-rotated-{tag}-fedcba9876543210");
    let v = drive(
        sdk,
        cp,
        domain,
        "vault",
        json!({"api": API, "other": OTHER, "secret": secret, "rotated": rotated,
            "upstream_ca": up.upstream_ca.cert_pem}),
    )
    .await?;
    assert_eq!(
        v["policy"],
        json!({"default": "deny", "egress": [{"action": "allow", "target": API}]}),
        "{sdk}: {v}"
    );
    // Allowed and tunnelled without a credential; a host the policy leaves out is refused.
    assert_eq!(v["plain"], "200", "{sdk}: {v}");
    assert_eq!(authorization(up, "/plain")?, None);
    assert_eq!(v["other_before"], "403", "{sdk}: {v}");

    // The vault: created at revision 1, read back without a value, injecting on its paths.
    assert_eq!(
        v["created"],
        json!({"revision": 1,
            "credentials": [{"name": "gh", "revision": 1, "source_type": "inline"}],
            "bindings": [{"name": "gh-api", "revision": 1, "hosts": [API], "auth": "bearer"}]}),
        "{sdk}: {v}"
    );
    assert_eq!(v["got"], v["created"], "{sdk}: {v}");
    assert_eq!(v["credentials"], json!(["gh"]), "{sdk}: {v}");
    assert_eq!(v["binding"], "gh-api", "{sdk}: {v}");
    assert_eq!(v["vault_call"], "200", "{sdk}: {v}");
    assert_eq!(
        authorization(up, "/vault/one")?,
        Some(format!("Bearer {secret}"))
    );
    assert_eq!(v["outside_paths"], "200", "{sdk}: {v}");
    assert_eq!(authorization(up, "/elsewhere")?, None, "outside its paths");

    // Refusals: a binding for a host no allow rule covers, a second vault, a stale revision.
    assert_eq!(v["uncovered"]["status"], 400, "{sdk}: {v}");
    assert_eq!(v["second_create"]["status"], 409, "{sdk}: {v}");
    assert_eq!(v["stale_revision"]["status"], 409, "{sdk}: {v}");

    // A rotated credential is injected from the next request on.
    assert_eq!(v["rotated"]["revision"], 2, "{sdk}: {v}");
    assert_eq!(v["rotated"]["credentials"][0]["revision"], 2, "{sdk}: {v}");
    assert_eq!(
        authorization(up, "/vault/two")?,
        Some(format!("Bearer {rotated}"))
    );

    // The policy patched at the egress endpoint: the new rule first, in effect at once.
    assert_eq!(
        v["patched"]["egress"],
        json!([{"action": "allow", "target": OTHER}, {"action": "allow", "target": API}]),
        "{sdk}: {v}"
    );
    assert_eq!(v["other_after_patch"], "200", "{sdk}: {v}");
    if v.get("deleted").is_some() {
        assert_eq!(
            v["deleted"]["egress"],
            json!([{"action": "allow", "target": API}]),
            "{sdk}: {v}"
        );
        assert_eq!(v["other_after_delete"], "403", "{sdk}: {v}");
    }

    // The sandbox never holds the value; a deleted vault injects nothing.
    assert_eq!(v["secret_in_sandbox"], "0", "{sdk}: {v}");
    assert_eq!(v["after_vault_delete"], "200", "{sdk}: {v}");
    assert_eq!(authorization(up, "/vault/three")?, None);
    assert_eq!(v["vault_gone"]["status"], 404, "{sdk}: {v}");
    let logs = cp.logs();
    assert!(
        !logs.contains(&secret) && !logs.contains(&rotated),
        "a credential is in the service's log"
    );
    Ok(())
}

#[tokio::test]
async fn a_vault_binding_injects_a_credential_the_sandbox_never_sees() -> Result<()> {
    let (stack, domain) = stack(&[]).await?;
    let _guard = DeploymentGuard(stack.cp.deployment.clone());
    for (sdk, tag) in [(NEWEST, "new"), (OLDEST, "old")] {
        // Each run sees its own paths: the upstream keeps every request.
        vault_turn(sdk, &stack, &domain, &format!("{tag}{}", free_port())).await?;
    }
    assert_nothing_left(&stack.cp);
    Ok(())
}

#[tokio::test]
async fn a_deny_rule_refuses_its_host_under_allow_and_bad_policies_are_refused() -> Result<()> {
    let (stack, domain) = stack(&[]).await?;
    let _guard = DeploymentGuard(stack.cp.deployment.clone());
    let cp = &stack.cp;
    let ca = &stack.up.upstream_ca.cert_pem;
    let params = json!({"api": API, "other": OTHER, "upstream_ca": ca});
    let v = drive(NEWEST, cp, &domain, "denylist", params).await?;
    assert_eq!(
        v["policy"],
        json!({"default": "allow", "egress": [{"action": "deny", "target": OTHER}]}),
        "{v}"
    );
    assert_eq!(v["api"], "200", "{v}");
    assert_eq!(v["other"], "403", "{v}");
    assert!(
        v["other_reason"]
            .as_str()
            .is_some_and(|r| r.to_ascii_lowercase().contains("rule-denied")),
        "{v}"
    );
    // A server of the sandbox's own, at the endpoint the SDK gives for its port.
    let p = drive(NEWEST, cp, &domain, "ports", json!({})).await?;
    let endpoint = p["endpoint"].as_str().unwrap_or_default();
    assert!(
        endpoint.starts_with(&format!("{domain}/ports/")) && endpoint.ends_with("/8765"),
        "{p}"
    );
    assert_eq!(p["page"], 200, "{p}");
    assert_eq!(p["seen_path"], "/page?q=1", "{p}");
    assert_eq!(p["header_names"], json!(["OPENSANDBOX-PORT-AUTH"]), "{p}");
    // The server is the sandbox's: it sees what the client meant for it, never the service's
    // credentials (the port's token, the API key).
    let seen = p["seen_headers"].to_string();
    assert!(seen.contains("x-mine"), "{p}");
    assert!(
        !seen.contains("opensandbox-port-auth") && !seen.contains("open-sandbox-api-key"),
        "{p}"
    );
    assert_eq!(p["without_headers"], 401, "{p}");
    // A port's token opens that port only.
    assert_eq!(p["port_token_on_execd"], 401, "{p}");
    let r = drive(NEWEST, cp, &domain, "refused", json!({})).await?;
    assert_eq!(r["nothing_reachable"]["status"], 400, "{r}");
    assert_eq!(r["cidr"]["status"], 400, "{r}");
    assert_eq!(r["no_gateway"]["status"], 409, "{r}");
    assert_nothing_left(cp);
    Ok(())
}

#[tokio::test]
async fn egress_and_the_vault_work_under_gvisor() -> Result<()> {
    let (stack, domain) = stack(&[("RUNTIME", "runsc")]).await?;
    let _guard = DeploymentGuard(stack.cp.deployment.clone());
    let params = json!({"api": API, "other": OTHER, "upstream_ca": stack.up.upstream_ca.cert_pem});
    let v = drive(NEWEST, &stack.cp, &domain, "denylist", params).await?;
    assert!(
        v["kernel_log"].to_string().contains("gVisor"),
        "not under gVisor: {v}"
    );
    assert_eq!(
        (v["api"].as_str(), v["other"].as_str()),
        (Some("200"), Some("403")),
        "{v}"
    );
    vault_turn(NEWEST, &stack, &domain, &format!("gv{}", free_port())).await?;
    assert_nothing_left(&stack.cp);
    Ok(())
}
