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
            let identity = match flags.assume_identity() {
                Ok(identity) => identity,
                Err(code) => return code,
            };
            let config = procs::supervisor::Config {
                socket: flags.processes(),
                identity,
                ..Default::default()
            };
            // The keep-alive (tini, not this, is PID 1; SIGTERM's default action ends it) and
            // the supervisor of background processes. Without the socket, commands still work.
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
