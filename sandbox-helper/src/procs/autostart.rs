//! The image's own service: `DAIV_SANDBOX_START` in the image's environment, a shell command the
//! sandbox user runs from the moment the sandbox starts (the code interpreter's server, in its
//! image), so a warm-pool member has it running before it is claimed. `init` starts it as the
//! sandbox user, like any command, and starts it again when it ends, after a pause that grows
//! while it keeps failing. It is not a background process of the API: it counts for neither the
//! per-session limit nor the reaper's "in use", and its output is dropped (a container log the
//! sandbox could write to would be its disk to fill).

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::env_file::claimed_env;
use crate::ops::run::shell;
use crate::procs::supervisor::Config;

/// The variable an image names its service in.
pub const START_ENV: &str = "DAIV_SANDBOX_START";
/// Longest pause between two starts of a service that keeps ending.
const MAX_PAUSE: Duration = Duration::from_secs(30);
/// A run this long counts as healthy: the next pause starts small again.
const HEALTHY: Duration = Duration::from_secs(60);

/// Starts the image's service, if it names one, on a thread of its own.
pub fn spawn(config: &Config) {
    let Some(command) = std::env::var(START_ENV)
        .ok()
        .filter(|c| !c.trim().is_empty())
    else {
        return;
    };
    let config = config.clone();
    let _ = std::thread::Builder::new()
        .name("autostart".into())
        .spawn(move || run(&config, &command));
}

fn run(config: &Config, command: &str) {
    let Some((program, flags)) = shell(&config.identity).argv() else {
        eprintln!("daiv-sandbox-helper: {START_ENV}: this image has no shell to run it with");
        return;
    };
    let mut pause = Duration::from_secs(1);
    loop {
        let started = Instant::now();
        let mut cmd = config.identity.sandbox_command(program);
        cmd.args(flags)
            .arg(command)
            .current_dir("/")
            .envs(claimed_env(&config.env_file))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        match cmd.spawn().and_then(|mut c| c.wait()) {
            Ok(status) => eprintln!("daiv-sandbox-helper: {START_ENV} ended ({status})"),
            Err(e) => eprintln!("daiv-sandbox-helper: {START_ENV} cannot start: {e}"),
        }
        if started.elapsed() >= HEALTHY {
            pause = Duration::from_secs(1);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(MAX_PAUSE);
    }
}
