//! `daiv-sandbox-helper`: `serve [--root DIR]` (the protocol on stdin/stdout, see the
//! `sandbox_protocol` crate), `init` (the container's keep-alive process and its process
//! supervisor), `write-file PATH MODE` (replace a file with stdin, atomically), `copy-tree FROM TO
//! [--max-bytes N]` (copy a frozen overlay upper directory into a new layer, see
//! `sandbox_helper::copy_tree`), `writable-paths --uids A-B --gids C-D [--except P,...]` (what
//! in an image a sandbox user could change, see `sandbox_helper::writable`) or `--version`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sandbox_helper::identity::{self, Identity, Ids};
use sandbox_helper::{copy_tree, procs, server, writable, write_file};

const USAGE: &str = "usage: daiv-sandbox-helper serve [--root DIR] [--service-dir DIR] [--processes NAME] [--user U:G --helper-user H:G] | init [--processes NAME] [--user U:G --helper-user H:G] | write-file PATH MODE [-- CMD...] | copy-tree FROM TO [FROM TO...] [--max-bytes N] | writable-paths --uids A-B --gids C-D [--except /P1,/P2,...] | --version";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["--version"] => {
            println!("daiv-sandbox-helper {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        ["init", rest @ ..] => {
            let Some(flags) = Flags::parse(rest, &["--processes", "--user", "--helper-user"])
            else {
                return usage();
            };
            if let Err(e) = shared_copy_is_sound(Path::new("/")) {
                eprintln!("daiv-sandbox-helper: refusing to start: {e}");
                return ExitCode::from(1);
            }
            let identity = match flags.assume_identity() {
                Ok(identity) => identity,
                Err(code) => return code,
            };
            let config = procs::supervisor::Config {
                socket: flags.processes(),
                identity,
                ..Default::default()
            };
            // The image's own service (`DAIV_SANDBOX_START`), then the keep-alive (tini, not
            // this, is PID 1; SIGTERM's default action ends it) and the supervisor of background
            // processes. Without the socket, commands still work.
            procs::autostart::spawn(&config);
            if let Err(e) = procs::supervisor::supervise(config) {
                eprintln!("daiv-sandbox-helper: no background processes: {e}");
            }
            loop {
                std::thread::park();
            }
        }
        ["serve", rest @ ..] => {
            let Some(flags) = Flags::parse(
                rest,
                &[
                    "--root",
                    "--service-dir",
                    "--processes",
                    "--user",
                    "--helper-user",
                ],
            ) else {
                return usage();
            };
            let identity = match flags.assume_identity() {
                Ok(identity) => identity,
                Err(code) => return code,
            };
            let defaults = server::Config::default();
            let config = server::Config {
                root: flags.get("--root").map_or(defaults.root, PathBuf::from),
                service_dir: flags
                    .get("--service-dir")
                    .map_or(defaults.service_dir, PathBuf::from),
                processes: flags.processes(),
                identity,
            };
            let code = server::serve(config);
            // Exit at once: request threads may still be blocked on what EOF just cancelled.
            std::process::exit(code)
        }
        // A background process's terminal side: a session of its own with stdin (the
        // terminal) as its controlling terminal, then the command (see procs::pty).
        ["pty-exec", "--", cmd @ ..] if !cmd.is_empty() => procs::pty::exec(cmd),
        ["write-file", path, mode, then @ ..] => {
            let then = match then {
                [] => None,
                ["--", cmd @ ..] if !cmd.is_empty() => Some(cmd),
                _ => return usage(),
            };
            let path = Path::new(path);
            match u32::from_str_radix(mode, 8) {
                Ok(mode) if path.file_name().is_some() => write_file::write_file(path, mode, then),
                _ => usage(),
            }
        }
        ["copy-tree", rest @ ..] => {
            // FROM TO pairs, then the one budget they share.
            let (pairs, max_bytes) = match rest {
                [pairs @ .., "--max-bytes", n] => match n.parse() {
                    Ok(n) => (pairs, Some(n)),
                    Err(_) => return usage(),
                },
                pairs => (pairs, None),
            };
            if pairs.is_empty() || pairs.len() % 2 != 0 || pairs.contains(&"--max-bytes") {
                return usage();
            }
            let pairs: Vec<(&Path, &Path)> = pairs
                .chunks(2)
                .map(|p| (Path::new(p[0]), Path::new(p[1])))
                .collect();
            copy_tree::command(&pairs, max_bytes)
        }
        ["writable-paths", rest @ ..] => match writable::Args::parse(rest) {
            Some(args) => writable::command(&args),
            None => usage(),
        },
        _ => usage(),
    }
}

/// Whether the helper, when [`layout::HELPER`] is a link into the engine's shared copy, is that
/// copy: the link names one file right in [`layout::HELPER_DIR`], and the service directory and
/// `HELPER_DIR` are real directories. The image supplies whatever the skeleton does not write,
/// and `HELPER_DIR` is the volume's mount point, which the skeleton cannot write: an image
/// shipping it as a link into a directory the sandbox user owns would put the mount there, and
/// the sandbox user could then swap the binary the service runs as root. Checked at `init`, which
/// starts the sandbox: nothing in the service directory can change afterwards (it is root's, and
/// its entries are mount points or root's files).
fn shared_copy_is_sound(root: &Path) -> Result<(), String> {
    use sandbox_protocol::layout::{HELPER, HELPER_DIR, SERVICE_DIR};
    let at = |p: &str| root.join(p.trim_start_matches('/'));
    let is_link = std::fs::symlink_metadata(at(HELPER)).is_ok_and(|m| m.file_type().is_symlink());
    if !is_link {
        return Ok(()); // its own copy, as the skeleton wrote it
    }
    let target = std::fs::read_link(at(HELPER)).map_err(|e| format!("{HELPER}: {e}"))?;
    let file = target
        .strip_prefix(HELPER_DIR)
        .ok()
        .filter(|f| f.components().count() == 1)
        .ok_or_else(|| format!("{HELPER} links outside {HELPER_DIR}"))?;
    if file.as_os_str().is_empty() {
        return Err(format!("{HELPER} names no file"));
    }
    for dir in [SERVICE_DIR, HELPER_DIR] {
        let m = std::fs::symlink_metadata(at(dir)).map_err(|e| format!("{dir}: {e}"))?;
        if !m.file_type().is_dir() {
            return Err(format!("{dir} is not a directory (a link in the image?)"));
        }
    }
    Ok(())
}

fn usage() -> ExitCode {
    eprintln!("{USAGE}");
    ExitCode::from(2)
}

/// `--flag VALUE` pairs, each flag at most once and among those allowed.
struct Flags<'a>(Vec<(&'a str, &'a str)>);

impl<'a> Flags<'a> {
    fn parse(args: &[&'a str], allowed: &[&str]) -> Option<Self> {
        let mut pairs = Vec::new();
        for pair in args.chunks(2) {
            let [flag, value] = pair else { return None };
            if !allowed.contains(flag) || pairs.iter().any(|(f, _)| f == flag) {
                return None;
            }
            pairs.push((*flag, *value));
        }
        Some(Self(pairs))
    }

    fn get(&self, flag: &str) -> Option<&'a str> {
        self.0.iter().find(|(f, _)| *f == flag).map(|(_, v)| *v)
    }

    /// `--processes NAME`: the supervisor's abstract socket (default one per sandbox).
    fn processes(&self) -> String {
        self.get("--processes")
            .unwrap_or(sandbox_protocol::layout::PROCESSES_SOCKET)
            .to_string()
    }

    /// `--user U:G --helper-user H:G` (both or neither): leave root for the helper's own uid
    /// before anything else runs (see `sandbox_helper::identity`). Refusing to go on is the only
    /// safe answer when that fails: serving as root would act on the sandbox's paths as root.
    fn assume_identity(&self) -> Result<Identity, ExitCode> {
        let parse = |flag| self.get(flag).map(|v| Ids::parse(v).ok_or(v));
        match (parse("--user"), parse("--helper-user")) {
            (None, None) => Ok(Identity::Inherited),
            (Some(Ok(sandbox)), Some(Ok(helper))) => {
                identity::assume(helper, sandbox).map_err(|e| {
                    eprintln!("daiv-sandbox-helper: cannot take the helper's uid {helper}: {e}");
                    ExitCode::from(3)
                })
            }
            _ => Err(usage()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::shared_copy_is_sound;
    use sandbox_protocol::layout::{HELPER, HELPER_DIR, SERVICE_DIR};
    use std::os::unix::fs::symlink;

    fn at(root: &std::path::Path, p: &str) -> std::path::PathBuf {
        root.join(p.trim_start_matches('/'))
    }

    /// The shared copy is run only when its mount point is a real directory: an image's link
    /// there (into a directory the sandbox user owns) stops the sandbox from starting.
    #[test]
    fn the_shared_copy_runs_only_from_a_real_mount_point() -> std::io::Result<()> {
        let root = tempfile::tempdir()?;
        let r = root.path();
        std::fs::create_dir_all(at(r, SERVICE_DIR))?;
        // Its own copy (a file): nothing to check.
        std::fs::write(at(r, HELPER), b"bin")?;
        assert!(shared_copy_is_sound(r).is_ok());
        std::fs::remove_file(at(r, HELPER))?;
        symlink(
            format!("{HELPER_DIR}/daiv-sandbox-helper-ab"),
            at(r, HELPER),
        )?;
        // The mount point a link the image shipped: refused.
        std::fs::create_dir_all(r.join("home/sandbox/real"))?;
        symlink("/home/sandbox/real", at(r, HELPER_DIR))?;
        assert!(shared_copy_is_sound(r).is_err());
        // A real directory: run.
        std::fs::remove_file(at(r, HELPER_DIR))?;
        std::fs::create_dir(at(r, HELPER_DIR))?;
        assert!(shared_copy_is_sound(r).is_ok());
        // A link out of it: refused.
        std::fs::remove_file(at(r, HELPER))?;
        symlink("/home/sandbox/real/x", at(r, HELPER))?;
        assert!(shared_copy_is_sound(r).is_err());
        std::fs::remove_file(at(r, HELPER))?;
        symlink(format!("{HELPER_DIR}/a/b"), at(r, HELPER))?;
        assert!(shared_copy_is_sound(r).is_err());
        Ok(())
    }
}
