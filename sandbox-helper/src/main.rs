//! `daiv-sandbox-helper`: `serve [--root DIR]` (the protocol on stdin/stdout, see the library
//! docs), `init` (the container's keep-alive process) or `--version`.

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: daiv-sandbox-helper serve [--root DIR] | init | --version";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["--version"] => {
            println!("daiv-sandbox-helper {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        // Keep-alive for shell-less images: park forever; SIGTERM's default action ends it
        // (tini, not this, is PID 1).
        ["init"] => loop {
            std::thread::park();
        },
        ["serve"] => serve(PathBuf::from(sandbox_helper::wire::WORKSPACE)),
        ["serve", "--root", dir] => serve(PathBuf::from(dir)),
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn serve(root: PathBuf) -> ExitCode {
    let code = sandbox_helper::ops::serve::serve(&root);
    // Exit at once: request threads may still be blocked on what EOF just cancelled.
    std::process::exit(code)
}
