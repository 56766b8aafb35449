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
