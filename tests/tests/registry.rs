//! Private registries end to end: a registry with htpasswd auth on loopback, images pushed to it
//! and absent locally, and the service pulling them with the credentials of the Docker client
//! config in its `DOCKER_CONFIG` directory: base images, the egress gateway image (on demand) and
//! warm-pool members. The file is read at every pull, so credentials rotate without a restart;
//! a denied pull is a 4xx (a 503 for the gateway) naming the image, and leaves nothing behind.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use e2e::egress::{EgressSettings, TestCa, Upstream, gateway_of};
use e2e::registry::PrivateRegistry;
use e2e::{
    BUSYBOX, ControlPlane, DEBIAN, DeploymentGuard, containers_with, eventually, inspect,
    networks_with, require_image,
};
use reqwest::Method;
use serde_json::{Value, json};

const GATEWAY_IMAGE: &str = "daiv-sandbox-egress:local";
/// Five `?` in a row: wherever they fall, the standard base64 of the daemon's auth header holds a
/// `/`, the case the engine must re-encode (the daemon reads the URL-safe alphabet only).
const ALICE: (&str, &str) = ("alice", "alice-pw?????>>>>>-1");
const BOB: (&str, &str) = ("bob", "bob-pw-2#~~~");

fn auth(user: (&str, &str)) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", user.0, user.1))
}

fn unique() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}

/// The service's `DOCKER_CONFIG` directory, and a directory for credential helpers to put in
/// front of its `PATH`.
struct ClientConfig {
    dir: PathBuf,
    helpers: PathBuf,
}

impl ClientConfig {
    fn new(registry: &PrivateRegistry) -> Result<Self> {
        let dir = registry.dir().join("service-docker-config");
        let helpers = registry.dir().join("service-helpers");
        std::fs::create_dir_all(&dir)?;
        std::fs::create_dir_all(&helpers)?;
        Ok(Self { dir, helpers })
    }

    /// Replaces `config.json` as editors and `docker login` do: a new file renamed over it.
    fn write(&self, config: Value) -> Result<()> {
        let tmp = self.dir.join("config.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&config)?)?;
        std::fs::rename(&tmp, self.dir.join("config.json"))?;
        Ok(())
    }

    /// `docker-credential-<name>`: answers `user` for `server`, "not found" for anything else,
    /// and records each server it is asked about.
    fn helper(&self, name: &str, server: &str, user: (&str, &str)) -> Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let asked = self.helpers.join(format!("{name}.asked"));
        let script = format!(
            "#!/bin/sh\n\
             [ \"$1\" = get ] || exit 1\n\
             read -r server || true\n\
             echo \"$server\" >> '{asked}'\n\
             if [ \"$server\" = '{server}' ]; then\n\
               printf '{{\"ServerURL\":\"%s\",\"Username\":\"%s\",\"Secret\":\"%s\"}}\\n' \"$server\" '{u}' '{p}'\n\
             else\n\
               echo 'credentials not found in native keychain'; exit 1\n\
             fi\n",
            asked = asked.display(),
            u = user.0,
            p = user.1,
        );
        let path = self.helpers.join(format!("docker-credential-{name}"));
        std::fs::write(&path, script)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(asked)
    }

    /// The service's process environment: this `DOCKER_CONFIG`, the helpers first on `PATH`.
    fn env(&self) -> Vec<(String, String)> {
        let path = std::env::var("PATH").unwrap_or_default();
        vec![
            ("DOCKER_CONFIG".into(), self.dir.display().to_string()),
            ("PATH".into(), format!("{}:{path}", self.helpers.display())),
        ]
    }
}

async fn start(settings: &[(&str, &str)], config: &ClientConfig) -> Result<ControlPlane> {
    let env = config.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    ControlPlane::start_with_process_env(settings, &env).await
}

/// Nothing of `deployment` exists on the engine: no container, no network (sessions' volumes are
/// anonymous: they exist only with their container).
fn nothing_left(deployment: &str) {
    let label = format!("daiv.sandbox.deployment={deployment}");
    assert_eq!(
        containers_with(&[&label]),
        Vec::<String>::new(),
        "containers left"
    );
    assert_eq!(
        networks_with(&[&label]),
        Vec::<String>::new(),
        "networks left"
    );
}

fn assert_no_secret(cp: &ControlPlane, secrets: &[&str]) {
    let logs = cp.logs();
    for s in secrets {
        assert!(!logs.contains(s), "the service logged a credential");
    }
}

async fn create(cp: &ControlPlane, body: Value) -> Result<(u16, Value)> {
    cp.call(Method::POST, "/session/", Some(body)).await
}

/// Creates a session of `image`, runs a command in it, and force-closes it.
async fn session_works(cp: &ControlPlane, image: &str) -> Result<()> {
    let s = cp.session_of(image).await?;
    let (code, out) = cp.sh(&s, "echo pulled-and-running").await?;
    anyhow::ensure!(code == 0 && out == "pulled-and-running\n", "{code} {out}");
    anyhow::ensure!(cp.force_close(&s).await? == 204);
    Ok(())
}

#[tokio::test]
async fn a_private_base_image_is_pulled_with_the_docker_config_credentials() -> Result<()> {
    require_image(BUSYBOX);
    let registry = PrivateRegistry::start(&[ALICE, BOB])?;
    // One tag per case: each pull starts with the image absent locally.
    let tag = unique();
    let image = |case: &str| registry.image("private/busybox", &format!("{tag}-{case}"));
    for case in ["auth", "fields", "helper"] {
        registry.push(BUSYBOX, &image(case), ALICE)?;
        assert!(!PrivateRegistry::present_locally(&image(case)));
    }
    let config = ClientConfig::new(&registry)?;
    let cp = start(&[], &config).await?;

    // No config file at all, then credentials the registry refuses: a 4xx naming the image and
    // the reason, and nothing created.
    for config_json in [
        None,
        Some(json!({"auths": {registry.host(): {"auth": auth((ALICE.0, "wrong-password"))}}})),
    ] {
        if let Some(c) = config_json {
            config.write(c)?;
        }
        let (status, body) = create(&cp, json!({"base_image": image("auth")})).await?;
        assert_eq!(status, 400, "{body}");
        let detail = body["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(&image("auth")), "{detail}");
        assert!(
            detail.contains("refused access for lack of valid credentials"),
            "{detail}"
        );
        assert!(
            !detail.contains("basic auth") && !detail.contains("unauthorized"),
            "{detail}"
        );
        nothing_left(&cp.deployment);
        assert!(!PrivateRegistry::present_locally(&image("auth")));
    }
    assert!(
        !cp.metrics().await?.contains("op=\"create\""),
        "a denied pull must create nothing"
    );

    // Rotated in the file, without a restart: `auth`, then another user's `username`/`password`.
    config.write(json!({"auths": {registry.host(): {"auth": auth(ALICE)}}}))?;
    session_works(&cp, &image("auth")).await?;
    config.write(json!({"auths": {
        format!("http://{}/v2/", registry.host()): {"username": BOB.0, "password": BOB.1}
    }}))?;
    session_works(&cp, &image("fields")).await?;

    // A credential helper on the service's PATH wins over `auths`, as in the Docker CLI.
    let helper = format!("daiv-e2e-{tag}");
    let asked = config.helper(&helper, &registry.host(), BOB)?;
    config.write(json!({
        "auths": {registry.host(): {"auth": auth((ALICE.0, "stale"))}},
        "credHelpers": {registry.host(): helper},
    }))?;
    session_works(&cp, &image("helper")).await?;
    let asked = std::fs::read_to_string(asked).context("the helper was not run")?;
    assert_eq!(asked.trim(), registry.host());

    assert_no_secret(
        &cp,
        &[ALICE.1, BOB.1, &auth(ALICE), &auth(BOB), "wrong-password"],
    );
    Ok(())
}

#[tokio::test]
async fn the_gateway_image_is_pulled_on_demand_with_the_credentials() -> Result<()> {
    require_image(DEBIAN);
    require_image(GATEWAY_IMAGE);
    let registry = PrivateRegistry::start(&[ALICE])?;
    let gateway_image = registry.image("private/egress", &unique());
    registry.push(GATEWAY_IMAGE, &gateway_image, ALICE)?;
    assert!(!PrivateRegistry::present_locally(&gateway_image));
    let up = Upstream::start(DEBIAN)?;
    let settings = EgressSettings::for_upstream(&up)?.set("EGRESS_PROXY_IMAGE", &gateway_image);
    let config = ClientConfig::new(&registry)?;
    config
        .write(json!({"auths": {registry.host(): {"auth": auth((ALICE.0, "wrong-password"))}}}))?;
    let cp = start(&settings.env(&[]), &config).await?;
    let body = json!({
        "base_image": DEBIAN,
        "egress": {"policy": {"default": "deny", "rules": [
            {"host": "api.upstream.test", "methods": ["GET"]}
        ]}}
    });

    // Refused: 503 in the reference's words, and no network, gateway or sandbox left.
    let (status, resp) = create(&cp, body.clone()).await?;
    assert_eq!(status, 503, "{resp}");
    let detail = resp["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with("Egress proxy failed to start"),
        "{detail}"
    );
    assert!(detail.contains("refused access"), "{detail}");
    nothing_left(&cp.deployment);

    // The right credential, rotated in: the gateway image is pulled and the session's traffic
    // goes through it.
    config.write(json!({"auths": {registry.host(): {"auth": auth(ALICE)}}}))?;
    let (status, resp) = create(&cp, body).await?;
    assert_eq!(status, 200, "{resp}");
    let s = e2e::Session {
        id: resp["session_id"]
            .as_str()
            .context("session_id")?
            .to_string(),
    };
    let (_, gateway) = gateway_of(&s.id)?;
    let info = inspect(&gateway).context("gateway container")?;
    assert_eq!(info["Config"]["Image"], json!(gateway_image));
    let (code, out) = cp
        .sh(
            &s,
            "curl -s -o /dev/null -w '%{http_code}' https://api.upstream.test/through-the-pulled-gateway",
        )
        .await?;
    assert_eq!((code, out.as_str()), (0, "200"));
    assert!(
        up.requests()?
            .iter()
            .any(|r| r["path"] == json!("/through-the-pulled-gateway")),
        "the upstream did not see the request"
    );
    assert_eq!(cp.force_close(&s).await?, 204);
    assert_no_secret(&cp, &[ALICE.1, &auth(ALICE), "wrong-password"]);
    Ok(())
}

/// Egress pool members of a private base image behind a private gateway image: a refused pull is
/// a refill failure (metric, nothing left); once the credential is rotated in, the next refill
/// pulls both and a member is ready.
#[tokio::test]
async fn warm_pool_refills_pull_private_images_with_the_credentials() -> Result<()> {
    require_image(BUSYBOX);
    require_image(GATEWAY_IMAGE);
    let registry = PrivateRegistry::start(&[ALICE])?;
    let tag = unique();
    let base = registry.image("private/busybox", &tag);
    let gateway_image = registry.image("private/egress", &tag);
    registry.push(BUSYBOX, &base, ALICE)?;
    registry.push(GATEWAY_IMAGE, &gateway_image, ALICE)?;
    let ca_dir = registry.dir().join("ca");
    let (cert, key) = write_ca(&ca_dir)?;
    let config = ClientConfig::new(&registry)?;
    config
        .write(json!({"auths": {registry.host(): {"auth": auth((ALICE.0, "wrong-password"))}}}))?;
    let deployment = format!("e2e-registry-pool-{tag}");
    let _guard = DeploymentGuard(deployment.clone());
    let pooled = format!("{base}=1");
    let cp = start(
        &[
            ("DEPLOYMENT", deployment.as_str()),
            ("WARM_POOL_EGRESS", pooled.as_str()),
            ("EGRESS_CA_CERT_FILE", cert.as_str()),
            ("EGRESS_CA_KEY_FILE", key.as_str()),
            ("EGRESS_PROXY_IMAGE", gateway_image.as_str()),
        ],
        &config,
    )
    .await?;
    let failures =
        format!("daiv_sandbox_pool_refill_failures_total{{image=\"{base}\",kind=\"egress\"}}");
    eventually("a refill failure", Duration::from_secs(60), || async {
        Ok(cp.metrics().await?.contains(&failures).then_some(()))
    })
    .await?;
    nothing_left(&deployment);
    assert!(!PrivateRegistry::present_locally(&base));
    assert!(!PrivateRegistry::present_locally(&gateway_image));

    config.write(json!({"auths": {registry.host(): {"auth": auth(ALICE)}}}))?;
    let label = format!("daiv.sandbox.deployment={deployment}");
    let member = eventually("a ready member", Duration::from_secs(120), || async {
        let ready = containers_with(&[&label, "daiv.sandbox.role=sandbox"])
            .into_iter()
            .find(|id| {
                inspect(id).is_some_and(|c| {
                    c["State"]["Running"] == json!(true)
                        && c["Name"]
                            .as_str()
                            .is_some_and(|n| n.starts_with("/daiv-pool-"))
                })
            });
        Ok(ready)
    })
    .await?;
    let (_, gateway) = gateway_of(&member)?;
    let info = inspect(&gateway).context("member's gateway")?;
    assert_eq!(info["Config"]["Image"], json!(gateway_image));
    assert!(PrivateRegistry::present_locally(&base));
    assert_no_secret(&cp, &[ALICE.1, &auth(ALICE), "wrong-password"]);
    Ok(())
}

fn write_ca(dir: &Path) -> Result<(String, String)> {
    std::fs::create_dir_all(dir)?;
    let ca = TestCa::new("daiv e2e registry pool CA")?;
    let cert = dir.join("egress-ca.crt");
    let key = dir.join("egress-ca.key");
    std::fs::write(&cert, &ca.cert_pem)?;
    std::fs::write(&key, &ca.key_pem)?;
    if !cert.is_file() {
        bail!("CA not written");
    }
    Ok((cert.display().to_string(), key.display().to_string()))
}
