//! `daiv-sandbox-helper`: `serve [--root DIR]` (the protocol on stdin/stdout, see the library
//! docs), `init` (the container's keep-alive process) or `--version`.

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: daiv-sandbox-helper serve [--root DIR] [--processes NAME] | init [--processes NAME] | --version";

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
                _ => (PathBuf::from(sandbox_helper::wire::WORKSPACE), rest),
            };
            let Some(name) = processes_flag(rest) else {
                return usage();
            };
            sandbox_helper::ops::procs::set_socket(name);
            serve(root)
        }
        _ => usage(),
    }
}

fn usage() -> ExitCode {
    eprintln!("{USAGE}");
    ExitCode::from(2)
}

/// `[--processes NAME]`: the supervisor's abstract socket (default one per sandbox).
fn processes_flag<'a>(rest: &[&'a str]) -> Option<&'a str> {
    match rest {
        [] => Some(sandbox_helper::ops::procs::DEFAULT_SOCKET),
        ["--processes", name] => Some(name),
        _ => None,
    }
}

fn serve(root: PathBuf) -> ExitCode {
    let code = sandbox_helper::ops::serve::serve(&root);
    // Exit at once: request threads may still be blocked on what EOF just cancelled.
    std::process::exit(code)
}
