//! The Python venvs the e2e suites drive real clients from (the MCP SDK, E2B's SDKs), made by
//! scripts/ensure-python-venv.sh from the pinned files in integration/python/, and the repository
//! root their scripts are found from.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The python of the venv `name` (`None`: the MCP SDK's, target/venv; `Some("e2b-2.63.0")`:
/// target/venv-e2b-2.63.0), made if needed (concurrent callers wait for each other). Panics with
/// the command that makes it when it cannot be made: a missing client fails the test, never skips it.
pub fn venv_python(name: Option<&str>) -> PathBuf {
    let script = repo_root().join("scripts/ensure-python-venv.sh");
    let mut cmd = Command::new(&script);
    if let Some(n) = name {
        cmd.arg(n);
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    assert!(
        out.status.success() && Path::new(&path).is_file(),
        "the Python venv {} could not be made ({}):\n{}\nmake it with \
         `scripts/ensure-python-venv.sh {}` (or `make venv`); it needs python3 with venv \
         (Debian: python3-venv) and PyPI for integration/python/",
        name.unwrap_or("(MCP)"),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim(),
        name.unwrap_or(""),
    );
    PathBuf::from(path)
}

/// Runs `integration/python/{script} {scenario}` with `python` and `env` (stdin closed), as a
/// user's program runs; the JSON of the last line it printed. A program that fails is the error,
/// with its status, stderr and stdout.
pub async fn drive_script(
    python: PathBuf,
    script: &str,
    scenario: &str,
    env: Vec<(String, String)>,
) -> anyhow::Result<serde_json::Value> {
    use anyhow::Context;
    let path = repo_root().join("integration/python").join(script);
    let (script, scenario) = (script.to_string(), scenario.to_string());
    tokio::task::spawn_blocking(move || {
        let out = Command::new(&python)
            .arg(&path)
            .arg(&scenario)
            .envs(env)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("spawn {}", python.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            anyhow::bail!(
                "{} {script} {scenario}: {}\nstderr:\n{stderr}\nstdout:\n{stdout}",
                python.display(),
                out.status
            );
        }
        let last = stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last)
            .with_context(|| format!("{script} {scenario}: not JSON: {stdout}\nstderr:\n{stderr}"))
    })
    .await?
}
