//! `daiv-sandbox-helper`: `serve [--root DIR]` (the protocol on stdin/stdout, see the library
//! docs), `init` (the container's keep-alive process), `write-file PATH MODE` (replace a file
//! with stdin, atomically) or `--version`.

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: daiv-sandbox-helper serve [--root DIR] [--service-dir DIR] [--processes NAME] [--user U:G --helper-user H:G] | init [--processes NAME] [--user U:G --helper-user H:G] | write-file PATH MODE [-- CMD...] | --version";

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
            let Some(flags) = Flags::parse(rest, &["--processes", "--user", "--helper-user"])
            else {
                return usage();
            };
            if let Err(code) = flags.assume_identity() {
                return code;
            }
            // The keep-alive (tini, not this, is PID 1; SIGTERM's default action ends it) and
            // the supervisor of background processes. Without the socket, commands still work.
            if let Err(e) = sandbox_helper::ops::procs::supervise(flags.processes()) {
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
            if let Err(code) = flags.assume_identity() {
                return code;
            }
            if let Some(dir) = flags.get("--service-dir") {
                sandbox_helper::ops::serve::set_service_dir(std::path::Path::new(dir));
            }
            sandbox_helper::ops::procs::set_socket(flags.processes());
            let root = flags
                .get("--root")
                .unwrap_or(sandbox_helper::layout::WORKSPACE);
            serve(PathBuf::from(root))
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

/// `write-file PATH MODE [-- CMD...]`: replaces PATH with the content on stdin (a
/// [`WriteHeader`](sandbox_helper::protocol::WriteHeader) line, then exactly its `len` bytes, at
/// most [`WRITE_MAX`]) by renaming a complete temporary file beside it over it, so a reader sees
/// the old content or the new, never part; input cut short writes nothing. Prints `ok` once
/// done; then runs CMD, with the header's `args` appended, if given, and prints `exit N` with its
/// exit code (and exits with it). The control plane runs it (as the owner of PATH's directory) to
/// install a claimed session's environment, or a policy and its acknowledgement in one exec,
/// without an archive upload; for a warm-pool member it opens the exec ahead of the claim.
fn write_file(path: &std::path::Path, mode: u32, then: Option<&[&str]>) -> ExitCode {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let Some(name) = path.file_name() else {
        return usage();
    };
    let tmp = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| -> std::io::Result<Vec<String>> {
        let (content, args) = read_write_input(&mut std::io::stdin().lock())?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(&content)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        Ok(args)
    })();
    match result {
        Ok(extra) => {
            println!("ok");
            let Some([cmd, args @ ..]) = then else {
                return ExitCode::SUCCESS;
            };
            let _ = std::io::Write::flush(&mut std::io::stdout());
            let code = std::process::Command::new(cmd)
                .args(args)
                .args(extra)
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

/// `write-file`'s input: the header line, then exactly its `len` bytes.
fn read_write_input(input: &mut impl std::io::BufRead) -> std::io::Result<(Vec<u8>, Vec<String>)> {
    use std::io::{BufRead, Read};
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut line = Vec::new();
    input
        .by_ref()
        .take(sandbox_helper::protocol::WRITE_HEADER_MAX as u64)
        .read_until(b'\n', &mut line)?;
    if line.pop() != Some(b'\n') {
        return Err(bad("no complete header line"));
    }
    let header: sandbox_helper::protocol::WriteHeader =
        serde_json::from_slice(&line).map_err(|_| bad("malformed header line"))?;
    if header.len > WRITE_MAX {
        return Err(bad("content too large"));
    }
    let mut content = vec![0; header.len as usize];
    input.read_exact(&mut content)?;
    Ok((content, header.args))
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
    fn processes(&self) -> &'a str {
        self.get("--processes")
            .unwrap_or(sandbox_helper::layout::PROCESSES_SOCKET)
    }

    /// `--user U:G --helper-user H:G` (both or neither): leave root for the helper's own uid
    /// before anything else runs (see `sandbox_helper::identity`). Refusing to go on is the only
    /// safe answer when that fails: serving as root would act on the sandbox's paths as root.
    fn assume_identity(&self) -> Result<(), ExitCode> {
        use sandbox_helper::identity::{Ids, assume};
        let parse = |flag| self.get(flag).map(|v| Ids::parse(v).ok_or(v));
        match (parse("--user"), parse("--helper-user")) {
            (None, None) => Ok(()),
            (Some(Ok(sandbox)), Some(Ok(helper))) => assume(helper, sandbox).map_err(|e| {
                eprintln!("daiv-sandbox-helper: cannot take the helper's uid {helper}: {e}");
                ExitCode::from(3)
            }),
            _ => Err(usage()),
        }
    }
}

fn serve(root: PathBuf) -> ExitCode {
    let code = sandbox_helper::ops::serve::serve(&root);
    // Exit at once: request threads may still be blocked on what EOF just cancelled.
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::read_write_input;
    use sandbox_helper::protocol::WriteHeader;

    #[test]
    fn write_input_is_the_header_then_exactly_its_content() {
        let framed = WriteHeader::frame(b"[]", vec!["v1".into()]);
        let mut more = framed.clone();
        more.extend_from_slice(b"ignored");
        let (content, args) = read_write_input(&mut more.as_slice()).expect("complete input");
        assert_eq!(
            (content.as_slice(), args),
            (&b"[]"[..], vec!["v1".to_string()])
        );
        // Cut anywhere short of the content's end (a writer dropped unused): nothing to write.
        for cut in 0..framed.len() {
            assert!(
                read_write_input(&mut &framed[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let huge = format!("{{\"len\": {}}}\n", super::WRITE_MAX + 1);
        assert!(read_write_input(&mut huge.as_bytes()).is_err());
    }
}
