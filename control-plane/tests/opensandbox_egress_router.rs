//! OpenSandbox's egress over the fake engine: a create's `networkPolicy` becomes the gateway's
//! policy (rules in order, `deny` rules, TLS terminated only for credentials), the egress
//! endpoint's `/policy` and `/credential-vault` answer as the SDK parses them, the vault's
//! values go to the gateway only, and what the gateway cannot enforce is refused.

mod harness;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use control_plane::engine::fake::FakeEngine;
use control_plane::opensandbox;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use shared_policy::sidecar;
use tower::ServiceExt;

use harness::{Harness, IMAGE, KEY};

const SECRET: &str = "vault-s3cr3t-0123456789";

struct Os {
    router: axum::Router,
    h: Harness,
}

/// The service with an egress CA (files read once, when the state is built).
fn service() -> Os {
    let dir = std::env::temp_dir().join(format!("daiv-os-egress-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let (cert, key) = (dir.join("ca.crt"), dir.join("ca.key"));
    std::fs::write(
        &cert,
        "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n",
    )
    .expect("cert");
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nKEY\n-----END PRIVATE KEY-----\n",
    )
    .expect("key");
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let h = Harness::new(
        FakeEngine::default(),
        &[("EGRESS_CA_CERT_FILE", &cert), ("EGRESS_CA_KEY_FILE", &key)],
    );
    let router = opensandbox::router(h.state.config.clone(), h.state.ops(), &h.state.metrics);
    Os { router, h }
}

impl Os {
    async fn send(
        &self,
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "127.0.0.1:8090");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let body = body.map(|b| Body::from(b.to_string())).unwrap_or_default();
        let resp = match self
            .router
            .clone()
            .oneshot(req.body(body).expect("request"))
            .await
        {
            Ok(r) => r,
            Err(e) => match e {},
        };
        let status = resp.status();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn create(&self, body: Value) -> (StatusCode, Value) {
        self.send(
            "POST",
            "/v1/sandboxes",
            &[("open-sandbox-api-key", KEY)],
            Some(body),
        )
        .await
    }

    /// The egress endpoint's path prefix and token.
    async fn egress(&self, id: &str) -> (String, String) {
        let (s, v) = self
            .send(
                "GET",
                &format!("/v1/sandboxes/{id}/endpoints/18080"),
                &[("open-sandbox-api-key", KEY)],
                None,
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let prefix = v["endpoint"]
            .as_str()
            .and_then(|e| e.strip_prefix("127.0.0.1:8090"))
            .expect("endpoint")
            .to_string();
        let token = v["headers"]["OPENSANDBOX-EGRESS-AUTH"]
            .as_str()
            .expect("token")
            .to_string();
        (prefix, token)
    }

    async fn call(
        &self,
        egress: &(String, String),
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let uri = format!("{}{path}", egress.0);
        self.send(
            method,
            &uri,
            &[("opensandbox-egress-auth", &egress.1)],
            body,
        )
        .await
    }

    /// The gateway of sandbox `id` (the one other container).
    fn gateway(&self, id: &str) -> String {
        self.h
            .engine
            .container_ids()
            .into_iter()
            .find(|c| c != id)
            .expect("a gateway")
    }

    /// The policy the gateway was given at create (its skeleton), as JSON.
    fn created_policy(&self, gateway: &str) -> Value {
        let spec = self.h.engine.spec(gateway).expect("gateway spec");
        let tar = spec
            .skeleton_archive()
            .expect("readable")
            .unwrap_or_default();
        let mut archive = tar::Archive::new(&tar[..]);
        for e in archive.entries().expect("entries") {
            let mut e = e.expect("entry");
            let path = e.path().expect("path").display().to_string();
            if path.ends_with(sidecar::POLICY_FILE) {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut e, &mut text).expect("text");
                return serde_json::from_str(&text).expect("json");
            }
        }
        panic!("no policy in the gateway's skeleton");
    }
}

fn body(policy: Value) -> Value {
    json!({"image": {"uri": IMAGE}, "entrypoint": ["tail", "-f", "/dev/null"], "networkPolicy": policy})
}

#[tokio::test]
async fn a_network_policy_becomes_the_gateways_rules_in_order() {
    let os = service();
    let (s, v) = os
        .create(body(json!({"defaultAction": "allow", "egress": [
            {"action": "allow", "target": "ok.bad.test"},
            {"action": "deny", "target": "*.bad.test"}
        ]})))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    let gateway = os.gateway(&id);
    let policy = os.created_policy(&gateway);
    assert_eq!(policy["policy"]["default"], "allow");
    // A deny rule under an allow default: every connection is terminated (no fronting).
    assert_eq!(policy["policy"]["intercept"], "all");
    assert_eq!(
        policy["policy"]["rules"],
        json!([
            {"host": "ok.bad.test", "methods": ["*"], "inject": null},
            {"host": "*.bad.test", "methods": ["*"], "inject": null, "action": "deny"}
        ])
    );
    // Read back at the egress endpoint as OpenSandbox's sidecar reports it.
    let egress = os.egress(&id).await;
    let (s, v) = os.call(&egress, "GET", "/policy", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        json!({"status": "ok", "mode": "allow_all", "enforcementMode": "proxy", "policy": {
            "defaultAction": "allow",
            "egress": [{"action": "allow", "target": "ok.bad.test"},
                       {"action": "deny", "target": "*.bad.test"}]}})
    );
    // Without the endpoint's token, or with execd's: nothing is looked up.
    let (s, _) = os
        .send("GET", &format!("{}/policy", egress.0), &[], None)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, v) = os
        .send(
            "GET",
            &format!("/v1/sandboxes/{id}/endpoints/44772"),
            &[("open-sandbox-api-key", KEY)],
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let execd_token = v["headers"]["X-EXECD-ACCESS-TOKEN"]
        .as_str()
        .expect("token");
    let (s, _) = os
        .send(
            "GET",
            &format!("{}/policy", egress.0),
            &[("opensandbox-egress-auth", execd_token)],
            None,
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = os
        .send(
            "GET",
            &format!("/execd/{id}/ping"),
            &[("x-execd-access-token", &egress.1)],
            None,
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "the egress token runs nothing");
}

#[tokio::test]
async fn a_vault_goes_to_the_gateway_only_and_reads_back_without_values() {
    let os = service();
    let (s, v) = os
        .create(body(
            json!({"egress": [{"action": "allow", "target": "api.vault.test"}]}),
        ))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    let gateway = os.gateway(&id);
    let egress = os.egress(&id).await;
    let (s, v) = os.call(&egress, "GET", "/credential-vault", None).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("NOT_FOUND"))
    );

    let vault = json!({
        "credentials": [{"name": "gh", "source": {"type": "inline", "value": SECRET}}],
        "bindings": [{"name": "gh-api", "match": {"hosts": ["api.vault.test"]},
                      "auth": {"type": "apiKey", "name": "X-Api-Key", "credential": "gh"}}]
    });
    let (s, v) = os
        .call(&egress, "POST", "/credential-vault", Some(vault))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(
        v,
        json!({"revision": 1,
            "credentials": [{"name": "gh", "sourceType": "inline", "revision": 1}],
            "bindings": [{"name": "gh-api", "revision": 1,
                "match": {"schemes": ["https"], "ports": [443], "hosts": ["api.vault.test"],
                          "methods": ["GET", "POST", "PUT", "PATCH", "DELETE"], "paths": ["/*"]},
                "auth": {"type": "apiKey", "name": "X-Api-Key"}}]})
    );
    // The policy staged for the gateway carries the header and a credential rule; the sandbox
    // got nothing, and no answer echoes the value.
    let staged =
        os.h.engine
            .file(
                &gateway,
                &sidecar::config_path(sidecar::POLICY_STAGING_FILE),
            )
            .expect("a policy staged for the gateway");
    let staged: Value = serde_json::from_slice(&staged).expect("json");
    let rules = staged["policy"]["rules"].as_array().expect("rules");
    assert!(
        rules
            .iter()
            .any(|r| r["action"] == "credential" && r["host"] == "api.vault.test"),
        "{staged}"
    );
    assert!(staged["secrets"].to_string().contains(SECRET));
    assert!(
        os.h.engine
            .file(&id, &sidecar::config_path(sidecar::POLICY_STAGING_FILE))
            .is_none()
    );
    let calls = os.h.engine.calls();
    assert!(
        calls
            .iter()
            .filter(|c| c.starts_with("put_archive"))
            .all(|c| !c.contains(&id)),
        "{calls:?}"
    );
    let (s, v) = os
        .call(&egress, "GET", "/credential-vault/bindings/gh-api", None)
        .await;
    // (read from the gateway's current file, which the fake never renames into place)
    assert!(
        s == StatusCode::NOT_FOUND || !v.to_string().contains(SECRET),
        "{v}"
    );
}

#[tokio::test]
async fn what_the_gateway_cannot_enforce_is_refused_before_anything_is_made() {
    let os = service();
    for (policy, want) in [
        (json!({"egress": []}), "reaches nothing"),
        (
            json!({"egress": [{"action": "allow", "target": "10.0.0.0/8"}]}),
            "CIDR",
        ),
        (
            json!({"egress": [{"action": "allow", "ports": [443]}]}),
            "ports",
        ),
        (
            json!({"egress": [{"action": "allow", "target": "a.test:443"}]}),
            "port",
        ),
        (
            json!({"egress": [{"action": "maybe", "target": "a.test"}]}),
            "unknown variant",
        ),
    ] {
        let (s, v) = os.create(body(policy.clone())).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{policy}: {v}");
        assert!(
            v["message"].as_str().is_some_and(|m| m.contains(want)),
            "{policy}: {v}"
        );
    }
    let (s, v) = os
        .create(json!({"image": {"uri": IMAGE}, "credentialProxy": {"enabled": true}}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(os.h.engine.container_ids().is_empty());

    // A sandbox without a network policy has no gateway to ask.
    let (s, v) = os.create(json!({"image": {"uri": IMAGE}})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    let egress = os.egress(&id).await;
    let (s, _) = os.call(&egress, "GET", "/policy", None).await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, _) = os
        .call(
            &egress,
            "PATCH",
            "/policy",
            Some(json!([{"action": "allow", "target": "a.test"}])),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
}
