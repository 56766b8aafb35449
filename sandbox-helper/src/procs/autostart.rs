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

/// Starts the image's service, if it names one, on a thread of its own; only in a sandbox, where
/// `init` runs commands as a sandbox user of their own (`--user`). Never with an inherited
/// identity: the service's own containers of an image (a snapshot's copier, a layer worker) run
/// `init` as root, with volumes mounted, and a command the image names must not run there.
pub fn spawn(config: &Config) {
    if !runs_as_sandbox_user(config) {
        return;
    }
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

/// Whether commands run as a sandbox user other than the helper's own (never root).
fn runs_as_sandbox_user(config: &Config) -> bool {
    config.identity.sandbox_user().is_some_and(|u| u.uid != 0)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{Identity, Ids};

    #[test]
    fn only_a_sandbox_with_a_user_of_its_own_starts_the_images_service() {
        let inherited = Config {
            identity: Identity::Inherited,
            ..Default::default()
        };
        assert!(
            !runs_as_sandbox_user(&inherited),
            "a copier or a layer worker: root, with volumes"
        );
        let own = |uid| Config {
            identity: Identity::Own {
                helper: Ids {
                    uid: 65533,
                    gid: 65533,
                },
                sandbox: Ids { uid, gid: uid },
            },
            ..Default::default()
        };
        assert!(runs_as_sandbox_user(&own(1000)));
        assert!(!runs_as_sandbox_user(&own(0)));
    }
}
