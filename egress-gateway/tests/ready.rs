//! The binary's side of the sidecar contract: once it listens it logs
//! [`sidecar::READY_LINE`], the line the control plane waits for before a sandbox may use the
//! gateway (the in-process suites never run `main`, so only this test and the end-to-end suites
//! see that line).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use shared_policy::sidecar;

const BIN: &str = env!("CARGO_BIN_EXE_daiv-egress-gateway");
/// Silence after which the line is taken as never coming (it comes within a second).
const GIVE_UP: Duration = Duration::from_secs(30);

#[test]
fn the_gateway_logs_the_ready_line_the_control_plane_waits_for() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (cert, key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
    let made = Command::new(BIN)
        .arg("gen-ca")
        .arg("--cert-out")
        .arg(&cert)
        .arg("--key-out")
        .arg(&key)
        .output()
        .expect("gen-ca runs");
    assert!(made.status.success(), "gen-ca: {made:?}");

    // A missing policy file is the fail-closed deny-all: the gateway still starts.
    let mut gateway = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0"])
        .arg("--policy-file")
        .arg(dir.path().join("absent.json"))
        .arg("--ca-cert-file")
        .arg(&cert)
        .arg("--ca-key-file")
        .arg(&key)
        .env_remove("RUST_LOG")
        .env_remove("LOG_LEVEL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the gateway starts");
    let stderr = gateway.stderr.take().expect("stderr piped");
    let (lines, seen_lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let mut ready = false;
    // Until the line comes, the gateway exits (its stderr ends) or stays silent for long: a
    // running gateway that never logs it would otherwise keep the test waiting.
    while let Ok(line) = seen_lines.recv_timeout(GIVE_UP) {
        let event: serde_json::Value = serde_json::from_str(&line).expect("a JSON log line");
        if event["fields"]["message"] == sidecar::READY_LINE {
            ready = true;
            break;
        }
        seen.push(line);
    }
    let _ = gateway.kill();
    let _ = gateway.wait();
    assert!(
        ready,
        "no {:?} line; stderr: {seen:#?}",
        sidecar::READY_LINE
    );
}
