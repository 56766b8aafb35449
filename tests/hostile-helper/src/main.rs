//! A session helper that turns hostile on demand, for the end-to-end tests of the control
//! plane's helper channel (never shipped). Given to sandboxes as `DAIV_SANDBOX_HELPER_BIN`, in an
//! image that carries the real helper at [`REAL`]: it runs the real helper unless the session's
//! environment (the caller's, in its environment file) has `DAIV_E2E_FLOOD`, in which case its
//! `serve` says it is ready and then floods
//! the channel the way a sandbox that took over its helper's pipes did in the hostile review:
//! frames for request ids nobody waits on, tiny and 16 MiB ones, as fast as the pipe takes them.
//! With `DAIV_E2E_OTHER_PROTOCOL`, the helper at the path sessions are created with plays a
//! helper of another build: its `serve` announces another protocol version, then says nothing.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use sandbox_protocol::frame::{encode, encode_json, kind};
use sandbox_protocol::message::Event;

/// Where the test image keeps the real helper.
const REAL: &str = "/opt/daiv-sandbox-helper";

fn flood() -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    // Ready in the control plane's own protocol version: the flood, not a version mismatch, is
    // what the channel must survive.
    let mut ready = Vec::new();
    let event = Event::Ready {
        protocol: sandbox_protocol::VERSION,
        version: "hostile".into(),
        pid: std::process::id(),
    };
    encode_json(0, kind::EVENT, &event, &mut ready);
    if stdout
        .write_all(&ready)
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    let mut small = Vec::new();
    for i in 0..4096u32 {
        encode(0x4000_0000 + i, kind::RESPONSE, br#"{"a":1}"#, &mut small);
    }
    // Valid JSON, as a parser that reads every frame it is given would want it.
    let mut payload = vec![b'x'; 16 << 20];
    payload[0] = b'"';
    if let Some(last) = payload.last_mut() {
        *last = b'"';
    }
    let mut big = Vec::new();
    encode(0x7fff_fff0, kind::RESPONSE, &payload, &mut big);
    // Until the control plane hangs up (then the write fails).
    loop {
        if stdout.write_all(&small).is_err() || stdout.write_all(&big).is_err() {
            return ExitCode::SUCCESS;
        }
    }
}

/// A helper of another protocol: ready in the next version, then silent until its input ends.
fn other_protocol() -> ExitCode {
    let mut ready = Vec::new();
    let event = Event::Ready {
        protocol: sandbox_protocol::VERSION + 1,
        version: "other-build".into(),
        pid: std::process::id(),
    };
    encode_json(0, kind::EVENT, &event, &mut ready);
    let mut stdout = std::io::stdout().lock();
    if stdout
        .write_all(&ready)
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    ExitCode::SUCCESS
}

/// Whether the session's caller gave variable `name` (the environment file the real helper reads
/// for every command: a JSON list of `[name, value]` pairs).
fn asked_for(name: &str) -> bool {
    std::fs::read_to_string(sandbox_protocol::layout::ENV_FILE)
        .is_ok_and(|env| env.contains(&format!("[\"{name}\",")))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // As it was called (the path may be a link into the engine's shared copy of the helper).
    let at_session_path = std::env::args_os()
        .next()
        .is_some_and(|p| p == sandbox_protocol::layout::HELPER);
    if args.first().map(String::as_str) == Some("serve")
        && asked_for("DAIV_E2E_OTHER_PROTOCOL")
        && at_session_path
    {
        return other_protocol();
    }
    if args.first().map(String::as_str) == Some("serve") && asked_for("DAIV_E2E_FLOOD") {
        return flood();
    }
    let err = std::process::Command::new(REAL).args(&args).exec();
    eprintln!("daiv-e2e-hostile-helper: cannot run {REAL}: {err}");
    ExitCode::from(127)
}
