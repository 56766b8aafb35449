//! The plain-HTTP opt-in (`DAIV_SANDBOX_EGRESS_PLAIN_HTTP_HOSTS`) end to end. DAIV's own
//! development stack pushes to its GitLab at `http://gitlab:8929`: plain HTTP to a private
//! address on the compose network, with the token injected by the egress gateway. Here that
//! GitLab is a plain-HTTP echo server named `gitlab.test` on port 8929, alone on a private
//! (RFC 1918) network the test creates, which the gateways' egress side joins.

use anyhow::Result;
use e2e::egress::{EgressSettings, PrivateUpstream, gateway_image, gateway_of};
use e2e::{ControlPlane, DEBIAN, Session, docker, inspect, require_image};
use serde_json::{Value, json};

const SECRET: &str = "glpat-e2ePlainHttp0123456789";
const GITLAB: &str = "http://gitlab.test:8929";

fn policy() -> Value {
    json!({
        "policy": {"default": "deny", "rules": [
            {"host": "gitlab.test", "methods": ["GET", "POST"], "inject": "gl"}
        ]},
        "secrets": {"gl": {"header": "PRIVATE-TOKEN", "value": SECRET}}
    })
}

/// A control plane whose gateways reach the private network through their egress side. No
/// `EGRESS_ALLOWED_CIDRS`: what reaches the private address is the opt-in alone.
async fn control_plane(up: &PrivateUpstream, extra: &[(&str, &str)]) -> Result<ControlPlane> {
    let settings = EgressSettings::on_network(up.dir(), &up.network)?;
    ControlPlane::start_with(&settings.env(extra)).await
}

fn seen(up: &PrivateUpstream, path_prefix: &str) -> Result<Option<Value>> {
    Ok(up.requests()?.into_iter().rev().find(|r| {
        r["path"]
            .as_str()
            .is_some_and(|p| p.starts_with(path_prefix))
    }))
}

/// The gateway's audit lines (its stdout).
fn audit(s: &Session) -> Result<Vec<Value>> {
    let (_, gateway) = gateway_of(&s.id)?;
    let out = docker(&["logs", &gateway])?;
    Ok(out
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

#[tokio::test]
async fn plain_http_opt_in_reaches_a_private_dev_stack_with_its_credential_and_only_with_it()
-> Result<()> {
    require_image(DEBIAN);
    require_image(&gateway_image());
    let up = PrivateUpstream::start(DEBIAN, &["gitlab.test"], 8929)?;

    // Without the opt-in (the default): refused, and the upstream never sees the credential.
    {
        let cp = control_plane(&up, &[]).await?;
        let s = cp
            .session(json!({"base_image": DEBIAN, "egress": policy()}))
            .await?;
        let (_, out) = cp
            .sh(
                &s,
                &format!("curl -s -D - -o /dev/null {GITLAB}/api/v4/projects"),
            )
            .await?;
        let head = out.to_ascii_lowercase();
        assert!(
            head.starts_with("http/1.1 403") && head.contains("x-egress-denied: tls-required"),
            "{out}"
        );
        let (_, out) = cp
            .sh(
                &s,
                &format!("git ls-remote {GITLAB}/daiv/repo.git 2>&1; true"),
            )
            .await?;
        assert!(up.requests()?.is_empty(), "reached the upstream: {out}");
        let lines = audit(&s)?;
        assert!(lines.iter().all(|l| l.get("plain_http_opt_in").is_none()));
    }

    // With it: curl and git reach the GitLab in plain HTTP, and it gets the injected token.
    let cp = control_plane(&up, &[("EGRESS_PLAIN_HTTP_HOSTS", "gitlab.test:8929")]).await?;
    let s = cp
        .session(json!({"base_image": DEBIAN, "egress": policy()}))
        .await?;
    let (code, out) = cp
        .sh(&s, &format!("curl -sS --fail {GITLAB}/api/v4/projects"))
        .await?;
    assert_eq!(code, 0, "{out}");
    let req = seen(&up, "/api/v4/projects")?.expect("the upstream saw the request");
    assert_eq!(req["headers"]["private-token"], SECRET);
    // The sandbox's own header is replaced, not forwarded.
    let (code, out) = cp
        .sh(
            &s,
            &format!("curl -sS --fail -H 'PRIVATE-TOKEN: forged' {GITLAB}/forged"),
        )
        .await?;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        seen(&up, "/forged")?.expect("seen")["headers"]["private-token"],
        SECRET
    );
    let (_, out) = cp
        .sh(
            &s,
            &format!("git ls-remote {GITLAB}/daiv/repo.git 2>&1; true"),
        )
        .await?;
    let git = seen(&up, "/daiv/repo.git/info/refs")?
        .unwrap_or_else(|| panic!("git never reached the upstream: {out}"));
    assert_eq!(git["headers"]["private-token"], SECRET);
    assert!(
        git["headers"]["user-agent"]
            .as_str()
            .is_some_and(|u| u.starts_with("git/"))
    );

    // The policy still decides (methods), and a port the setting does not list stays TLS-only.
    let (_, out) = cp
        .sh(
            &s,
            &format!("curl -s -D - -o /dev/null -X DELETE {GITLAB}/api/v4/projects/1"),
        )
        .await?;
    assert!(
        out.to_ascii_lowercase()
            .contains("x-egress-denied: method-not-allowed"),
        "{out}"
    );
    let (_, out) = cp
        .sh(
            &s,
            "curl -s -D - -o /dev/null http://gitlab.test:8930/api/v4/projects",
        )
        .await?;
    assert!(
        out.to_ascii_lowercase()
            .contains("x-egress-denied: tls-required"),
        "{out}"
    );
    assert!(seen(&up, "/api/v4/projects/1")?.is_none());

    // The sandbox still has no way to the upstream but the gateway.
    let upstream_ip = inspect(&up.container)
        .and_then(|c| {
            c["NetworkSettings"]["Networks"][&up.network]["IPAddress"]
                .as_str()
                .map(str::to_owned)
        })
        .expect("upstream address");
    let (code, _) = cp
        .sh(
            &s,
            &format!("curl -sS --noproxy '*' --max-time 5 http://{upstream_ip}:8929/direct"),
        )
        .await?;
    assert_ne!(code, 0, "direct connection must fail");

    // Every audit line of those exchanges says it went under the opt-in; none has the token.
    let lines = audit(&s)?;
    let plain: Vec<&Value> = lines
        .iter()
        .filter(|l| l["host"] == "gitlab.test" && l["port"] == 8929)
        .collect();
    assert!(plain.len() >= 4, "{lines:?}");
    assert!(
        plain.iter().all(|l| l["plain_http_opt_in"] == true),
        "{plain:?}"
    );
    assert!(plain.iter().any(|l| l["decision"] == "allow"
        && l["injected"] == "PRIVATE-TOKEN"
        && l["path"] == "/api/v4/projects"));
    assert!(
        lines
            .iter()
            .filter(|l| l["port"] == 8930)
            .all(|l| l.get("plain_http_opt_in").is_none())
    );
    let (_, gateway) = gateway_of(&s.id)?;
    let everything = docker(&["logs", &gateway])?;
    assert!(
        !everything.contains(SECRET),
        "the token is in the gateway's audit log"
    );
    Ok(())
}
