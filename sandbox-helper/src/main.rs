//! `daiv-sandbox-helper`: `serve [--root DIR]` (the protocol on stdin/stdout, see the library
//! docs), `init` (the container's keep-alive process), `write-file PATH MODE` (replace a file
//! with stdin, atomically) or `--version`.

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: daiv-sandbox-helper serve [--root DIR] [--env-file PATH] [--processes NAME] | init [--processes NAME] | write-file PATH MODE [-- CMD...] | --version";

/// Largest content `write-file` takes.
const WRITE_MAX: u64 = 16 * 1024 * 1024;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["--version"] => {
            println!("daiv-sandbox-helper {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        ["init", rest @ ..] => {
            let Some(name) = processes_flag(rest) else {
                return usage();
            };
            // The keep-alive (tini, not this, is PID 1; SIGTERM's default action ends it) and
            // the supervisor of background processes. Without the socket, commands still work.
            if let Err(e) = sandbox_helper::ops::procs::supervise(name) {
                eprintln!("daiv-sandbox-helper: no background processes: {e}");
            }
            loop {
                std::thread::park();
            }
        }
        ["serve", rest @ ..] => {
            let (root, rest) = match rest {
                ["--root", dir, rest @ ..] => (PathBuf::from(dir), rest),
                _ => (PathBuf::from(sandbox_helper::layout::WORKSPACE), rest),
            };
            let rest = match rest {
                ["--env-file", path, rest @ ..] => {
                    sandbox_helper::ops::serve::set_env_file(std::path::Path::new(path));
                    rest
                }
                _ => rest,
            };
            let Some(name) = processes_flag(rest) else {
                return usage();
            };
            sandbox_helper::ops::procs::set_socket(name);
            serve(root)
        }
        ["write-file", path, mode, then @ ..] => {
            let then = match then {
                [] => None,
                ["--", cmd @ ..] if !cmd.is_empty() => Some(cmd),
                _ => return usage(),
            };
            match u32::from_str_radix(mode, 8) {
                Ok(mode) => write_file(std::path::Path::new(path), mode, then),
                Err(_) => usage(),
            }
        }
        _ => usage(),
    }
}

/// `write-file PATH MODE [-- CMD...]`: replaces PATH with stdin (at most [`WRITE_MAX`] bytes) by
/// renaming a complete temporary file beside it over it, so a reader sees the old content or the
/// new, never part. Prints `ok` once done; then runs CMD, if given, and prints `exit N` with its
/// exit code (and exits with it). The control plane runs it (as the owner of PATH's directory) to
/// install a claimed session's environment, or a policy and its acknowledgement in one exec,
/// without an archive upload.
fn write_file(path: &std::path::Path, mode: u32, then: Option<&[&str]>) -> ExitCode {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let Some(name) = path.file_name() else {
        return usage();
    };
    let tmp = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| -> std::io::Result<()> {
        let mut content = Vec::new();
        std::io::stdin()
            .lock()
            .take(WRITE_MAX + 1)
            .read_to_end(&mut content)?;
        if content.len() as u64 > WRITE_MAX {
            return Err(std::io::Error::other("content too large"));
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(&content)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    match result {
        Ok(()) => {
            println!("ok");
            let Some([cmd, args @ ..]) = then else {
                return ExitCode::SUCCESS;
            };
            let _ = std::io::Write::flush(&mut std::io::stdout());
            let code = std::process::Command::new(cmd)
                .args(args)
                .stdin(std::process::Stdio::null())
                .status()
                .map(|s| s.code().unwrap_or(128))
                .unwrap_or(127);
            println!("exit {code}");
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            eprintln!("daiv-sandbox-helper: cannot write {}: {e}", path.display());
            ExitCode::FAILURE
        }
    }
}

fn usage() -> ExitCode {
    eprintln!("{USAGE}");
    ExitCode::from(2)
}

/// `[--processes NAME]`: the supervisor's abstract socket (default one per sandbox).
fn processes_flag<'a>(rest: &[&'a str]) -> Option<&'a str> {
    match rest {
        [] => Some(sandbox_helper::layout::PROCESSES_SOCKET),
        ["--processes", name] => Some(name),
        _ => None,
    }
}

fn serve(root: PathBuf) -> ExitCode {
    let code = sandbox_helper::ops::serve::serve(&root);
    // Exit at once: request threads may still be blocked on what EOF just cancelled.
    std::process::exit(code)
}
