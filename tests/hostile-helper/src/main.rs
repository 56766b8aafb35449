//! A session helper that turns hostile on demand, for the end-to-end tests of the control
//! plane's helper channel (never shipped). Given to sandboxes as `DAIV_SANDBOX_HELPER_BIN`, in an
//! image that carries the real helper at [`REAL`]: it runs the real helper unless the container's
//! environment has `DAIV_E2E_FLOOD`, in which case its `serve` says it is ready and then floods
//! the channel the way a sandbox that took over its helper's pipes did in the hostile review:
//! frames for request ids nobody waits on, tiny and 16 MiB ones, as fast as the pipe takes them.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

/// Where the test image keeps the real helper.
const REAL: &str = "/opt/daiv-sandbox-helper";

fn frame(out: &mut Vec<u8>, id: u32, kind: u8, payload: &[u8]) {
    let len = u32::try_from(payload.len() + 5).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&id.to_be_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
}

fn flood() -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    let mut ready = Vec::new();
    let event = format!(
        r#"{{"type":"ready","protocol":1,"version":"hostile","pid":{}}}"#,
        std::process::id()
    );
    frame(&mut ready, 0, 5, event.as_bytes());
    if stdout
        .write_all(&ready)
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    let mut small = Vec::new();
    for i in 0..4096u32 {
        frame(&mut small, 0x4000_0000 + i, 6, br#"{"a":1}"#);
    }
    // Valid JSON, as a parser that reads every frame it is given would want it.
    let mut payload = vec![b'x'; 16 << 20];
    payload[0] = b'"';
    if let Some(last) = payload.last_mut() {
        *last = b'"';
    }
    let mut big = Vec::new();
    frame(&mut big, 0x7fff_fff0, 6, &payload);
    // Until the control plane hangs up (then the write fails).
    loop {
        if stdout.write_all(&small).is_err() || stdout.write_all(&big).is_err() {
            return ExitCode::SUCCESS;
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("serve")
        && std::env::var_os("DAIV_E2E_FLOOD").is_some()
    {
        return flood();
    }
    let err = std::process::Command::new(REAL).args(&args).exec();
    eprintln!("daiv-e2e-hostile-helper: cannot run {REAL}: {err}");
    ExitCode::from(127)
}
