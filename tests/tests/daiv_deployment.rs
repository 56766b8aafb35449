//! DAIV deployed as its own documentation says: `DAIV_SANDBOX_URL=http://sandbox:8000` (no
//! prefix), a client that posts to relative `session/...` paths with an `X-API-KEY` header, the
//! fs routes without a trailing slash, and the stale `DAIV_SANDBOX_KEEP_TEMPLATE` of DAIV's swarm
//! guide in the service's environment. One agent turn with egress, every body validated against
//! DAIV's wire schemas, exactly as its client validates them.

use anyhow::{Context, Result, ensure};
use base64::Engine as _;
use e2e::egress::EgressStack;
use e2e::workspace::{Member, gzip, tar_of, validate};
use e2e::{ControlPlane, DEBIAN, containers_with, require_image};
use reqwest::Method;
use serde_json::{Value, json};

const TOKEN: &str = "glpat-daivDeploymentToken42";

/// DAIV's client: an `httpx.AsyncClient(base_url=SANDBOX_URL)` and relative paths (the suites'
/// API client at the bare service URL, no `/api/v1`).
struct DaivClient {
    api: e2e::api::Client,
}

impl DaivClient {
    /// A request to the relative path, with the API key.
    fn request(&self, method: Method, relative: &str) -> reqwest::RequestBuilder {
        self.api.request(method, &format!("/{relative}"))
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<(u16, Value)> {
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await?;
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    async fn post(&self, relative: &str, body: &Value) -> Result<(u16, Value)> {
        self.send(self.request(Method::POST, relative).json(body))
            .await
    }

    /// `POST session/{id}/fs/{op}` (no trailing slash, as DAIV sends it), validated.
    async fn fs(&self, id: &str, op: &str, body: Value) -> Result<Value> {
        let request_schema = format!("Fs{}{}Request", &op[..1].to_uppercase(), &op[1..]);
        validate(&request_schema, &body)?;
        let (status, v) = self.post(&format!("session/{id}/fs/{op}"), &body).await?;
        ensure!(status == 200, "fs/{op}: {status} {v}");
        validate(&request_schema.replace("Request", "Response"), &v)?;
        ensure!(v["error"].is_null(), "fs/{op}: {v}");
        Ok(v)
    }
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

#[tokio::test]
async fn a_daiv_turn_with_egress_works_on_the_documented_bare_url() -> Result<()> {
    let EgressStack { up, cp } = EgressStack::start_with(&[("KEEP_TEMPLATE", "true")]).await?;
    let daiv = DaivClient { api: cp.root() };

    // Health at the root, as the reference's own Docker healthcheck probes it.
    let (status, health) = daiv.send(daiv.request(Method::GET, "-/health/")).await?;
    assert_eq!((status, &health["status"]), (200, &json!("ok")));

    let egress = |token: &str| {
        json!({
            "policy": {"default": "deny", "intercept": "all", "rules": [
                {"host": "api.upstream.test", "methods": ["GET", "POST"], "inject": "gitlab"}
            ]},
            "secrets": {"gitlab": {"header": "PRIVATE-TOKEN", "value": token}}
        })
    };
    let start = json!({
        "base_image": DEBIAN,
        "environment": {"DAIV_TURN": "1"},
        "memory_bytes": 536_870_912,
        "egress": egress(TOKEN),
    });
    validate("StartSessionRequest", &start)?;
    let (status, created) = daiv.post("session/", &start).await?;
    assert_eq!(status, 200, "{created}");
    validate("StartSessionResponse", &created)?;
    let id = created["session_id"]
        .as_str()
        .context("session_id")?
        .to_string();
    let _cleanup = e2e::Session { id: id.clone() };

    // Seed, as DAIV's client does: both archives, octet-stream parts named after their fields.
    let repo = gzip(&tar_of(&[
        Member::File("README.md", b"# project\nhello daiv\n", 0o644),
        Member::File("src/main.py", b"print('hello')\n", 0o644),
    ])?)?;
    let skills = tar_of(&[Member::File("skill/SKILL.md", b"# skill\n", 0o644)])?;
    let form = reqwest::multipart::Form::new()
        .part(
            "repo_archive",
            reqwest::multipart::Part::bytes(repo)
                .file_name("repo_archive")
                .mime_str("application/octet-stream")?,
        )
        .part(
            "skills_archive",
            reqwest::multipart::Part::bytes(skills)
                .file_name("skills_archive")
                .mime_str("application/octet-stream")?,
        );
    let (status, body) = daiv
        .send(
            daiv.request(Method::POST, &format!("session/{id}/seed/"))
                .multipart(form),
        )
        .await?;
    assert_eq!(status, 204, "{body}");

    // Run: the repo is there, the environment too, and the egress proxy injects the token.
    let run = json!({
        "commands": [
            "cat README.md && echo \"turn=$DAIV_TURN\" && ls ../skills/skill",
            "curl -sS --fail https://api.upstream.test/api/v4/projects",
        ],
        "fail_fast": true,
    });
    validate("RunRequest", &run)?;
    let (status, ran) = daiv.post(&format!("session/{id}/"), &run).await?;
    assert_eq!(status, 200, "{ran}");
    validate("RunResponse", &ran)?;
    let out = |i: usize| ran["results"][i]["output"].as_str().unwrap_or_default();
    assert!(
        out(0).contains("hello daiv") && out(0).contains("turn=1") && out(0).contains("SKILL.md"),
        "{ran}"
    );
    assert_eq!(ran["results"][1]["exit_code"], 0, "{ran}");
    let seen = up
        .requests()?
        .into_iter()
        .rev()
        .find(|r| r["path"] == "/api/v4/projects")
        .context("the upstream saw the request")?;
    assert_eq!(seen["headers"]["private-token"], TOKEN);
    // (The echo upstream reflects the headers it got; the sandbox's own environment has none.)
    let (_, env) = daiv
        .post(&format!("session/{id}/"), &json!({"commands": ["env"]}))
        .await?;
    assert!(
        !env.to_string().contains(TOKEN),
        "the sandbox sees the token"
    );

    // Every fs op DAIV's file backend uses.
    let r = "/workspace/repo";
    let ls = daiv.fs(&id, "ls", json!({"path": r})).await?;
    assert!(ls.to_string().contains("README.md"), "{ls}");
    let read = daiv
        .fs(&id, "read", json!({"path": format!("{r}/README.md")}))
        .await?;
    assert!(read.to_string().contains("hello daiv"), "{read}");
    let grep = daiv
        .fs(&id, "grep", json!({"pattern": "hel+o", "path": r}))
        .await?;
    assert!(grep.to_string().contains("README.md"), "{grep}");
    let glob = daiv
        .fs(&id, "glob", json!({"pattern": "**/*.py", "path": r}))
        .await?;
    assert!(glob.to_string().contains("main.py"), "{glob}");
    daiv.fs(
        &id,
        "write",
        json!({"path": format!("{r}/new.txt"), "content": b64(b"one\n")}),
    )
    .await?;
    daiv.fs(
        &id,
        "edit",
        json!({"path": format!("{r}/new.txt"), "old": "one", "new": "two"}),
    )
    .await?;
    let (_, check) = daiv
        .post(
            &format!("session/{id}/"),
            &json!({"commands": ["cat new.txt"]}),
        )
        .await?;
    assert_eq!(check["results"][0]["output"], "two\n", "{check}");
    daiv.fs(&id, "delete", json!({"path": format!("{r}/new.txt")}))
        .await?;

    // A fresh token for the next turn, then the warm check DAIV makes before reusing a session.
    let rotated = "glpat-rotatedToken43";
    let refresh = egress(rotated);
    validate("EgressConfigRequest", &refresh)?;
    let (status, body) = daiv
        .send(
            daiv.request(Method::PUT, &format!("session/{id}/egress/"))
                .json(&refresh),
        )
        .await?;
    assert_eq!(status, 204, "{body}");
    let (_, ran) = daiv
        .post(
            &format!("session/{id}/"),
            &json!({"commands": ["curl -sS --fail https://api.upstream.test/after-refresh"]}),
        )
        .await?;
    assert_eq!(ran["results"][0]["exit_code"], 0, "{ran}");
    let seen = up
        .requests()?
        .into_iter()
        .rev()
        .find(|r| r["path"] == "/after-refresh")
        .context("seen")?;
    assert_eq!(seen["headers"]["private-token"], rotated);

    // Close: stop (kept warm), the warm check restarts it, then remove (`force` as httpx sends it).
    let (status, _) = daiv
        .send(
            daiv.request(Method::DELETE, &format!("session/{id}/"))
                .query(&[("force", "false")]),
        )
        .await?;
    assert_eq!(status, 204);
    let (status, _) = daiv
        .send(daiv.request(Method::GET, &format!("session/{id}/")))
        .await?;
    assert_eq!(status, 204);
    let (status, _) = daiv
        .send(
            daiv.request(Method::DELETE, &format!("session/{id}/"))
                .query(&[("force", "true")]),
        )
        .await?;
    assert_eq!(status, 204);
    let (status, _) = daiv
        .send(daiv.request(Method::GET, &format!("session/{id}/")))
        .await?;
    assert_eq!(status, 404, "DAIV reads 404 as gone");
    let left = containers_with(&[&format!("daiv.sandbox.deployment={}", cp.deployment)]);
    assert!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}

#[tokio::test]
async fn without_an_egress_ca_daiv_reads_the_reference_sentence() -> Result<()> {
    require_image(DEBIAN);
    let cp = ControlPlane::start_with(&[("KEEP_TEMPLATE", "true")]).await?;
    let resp = DaivClient { api: cp.root() }
        .request(Method::POST, "session/")
        .json(&json!({"base_image": DEBIAN, "egress": {"policy": {"default": "allow"}}}))
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 400);
    // DAIV: `status_code == 400 and "egress proxy" in response.text.lower()` → fail closed and
    // tell the operator to configure the CA.
    let text = resp.text().await?;
    assert!(text.to_lowercase().contains("egress proxy"), "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text)?["detail"],
        "egress requires the egress proxy, which is not configured on this deployment"
    );
    assert!(
        cp.logs().contains("DAIV_SANDBOX_EGRESS_CA_CERT_FILE"),
        "the log names the settings to set"
    );
    Ok(())
}
