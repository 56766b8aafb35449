//! The control-plane image, started the way docs/operations/deploy.md says (`docker run` with
//! the Docker socket mounted), creates, drives and closes a session.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use e2e::{BUSYBOX, docker, docker_quietly, eventually, free_port, require_image};
use serde_json::{Value, json};

const IMAGE: &str = "daiv-sandbox:local";

/// The service's container; removed on drop, pass or fail.
struct Service {
    name: String,
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Ok(o) = Command::new("docker")
            .args(["logs", "--tail", "40", &self.name])
            .output()
        {
            eprintln!(
                "--- {} logs:\n{}{}",
                self.name,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        docker_quietly(&["rm", "-fv", &self.name]);
    }
}

#[tokio::test]
async fn the_image_serves_a_session_end_to_end() -> Result<()> {
    require_image(BUSYBOX);
    assert!(
        docker(&["image", "inspect", IMAGE]).is_ok(),
        "image {IMAGE} missing: run `images/control-plane/build-local.sh` (make images)"
    );
    let port = free_port();
    let name = format!("daiv-sandbox-e2e-image-{}-{port}", std::process::id());
    let key = format!("image-key-{port}");
    let publish = format!("127.0.0.1:{port}:8000");
    let api_key = format!("DAIV_SANDBOX_API_KEY={key}");
    // The line of docs/operations/deploy.md, plus the socket, a loopback-only port and no pull.
    docker(&[
        "run",
        "--rm",
        "-d",
        "--pull",
        "never",
        "--name",
        &name,
        "-p",
        &publish,
        "-e",
        &api_key,
        "-v",
        "/var/run/docker.sock:/var/run/docker.sock",
        IMAGE,
    ])?;
    let _service = Service { name: name.clone() };

    let config: Value = serde_json::from_str(&docker(&[
        "inspect",
        "--format",
        "{{json .Config}}",
        &name,
    ])?)?;
    let user = config["User"].as_str().unwrap_or_default();
    assert!(
        !user.is_empty() && !user.starts_with("0") && !user.starts_with("root"),
        "runs as root: {user:?}"
    );
    assert_eq!(
        config["Healthcheck"]["Test"][1], "/daiv-sandbox",
        "{config}"
    );

    let base = format!("http://127.0.0.1:{port}");
    let api = e2e::api::Client::new(&format!("{base}/api/v1"), &key)?;
    eventually("the image healthy", Duration::from_secs(30), || async {
        let r = api.http().get(format!("{base}/-/health/")).send().await;
        Ok(r.is_ok_and(|r| r.status().is_success()).then_some(()))
    })
    .await?;
    // The HEALTHCHECK command itself, as Docker runs it.
    let probe = docker(&["exec", &name, "/daiv-sandbox", "healthcheck"]);
    assert!(probe.is_ok(), "healthcheck subcommand failed: {probe:?}");

    let id = api
        .create_session(json!({"base_image": BUSYBOX}))
        .await?
        .session_id;
    let _session = e2e::Session { id: id.clone() };
    let ran = api
        .run(&id, json!({"commands": ["echo from-the-image && id -u"]}))
        .await?;
    assert_eq!(ran.results[0].exit_code, 0, "{ran:?}");
    assert_eq!(ran.results[0].output, "from-the-image\n1000\n", "{ran:?}");
    assert_eq!(api.force_close(&id).await?, 204);
    assert!(e2e::inspect(&id).is_none(), "session container left behind");
    Ok(())
}

/// `integration/compose.yaml` (control plane + Redis + the gateway image) comes up, passes its
/// health checks and serves a plain and an egress session; the script tears it down either way.
#[tokio::test]
async fn the_compose_stack_comes_up_and_serves_a_session() -> Result<()> {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../integration/compose/smoke.sh");
    let out = tokio::process::Command::new(&script)
        .output()
        .await
        .with_context(|| format!("run {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "smoke failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("smoke: compose stack OK"),
        "{stdout}\n{stderr}"
    );
    Ok(())
}
