//! `write-file`: one file replaced atomically from stdin, its input in the format of
//! [`sandbox_protocol::write_file`].

use std::path::Path;
use std::process::ExitCode;

use sandbox_protocol::write_file::{
    WRITE_CONTENT_MAX, WRITE_HEADER_MAX, WRITTEN, WriteHeader, exit_line,
};

/// `write-file PATH MODE [-- CMD...]`: replaces PATH with the content on stdin (a
/// [`WriteHeader`] line, then exactly its `len` bytes, at most [`WRITE_CONTENT_MAX`]) by
/// renaming a complete temporary file beside it over it, so a reader sees the old content or
/// the new, never part; input cut short writes nothing. Prints [`WRITTEN`] once done; then runs
/// CMD, with the header's `args` appended, if given, and prints its [`exit_line`] (and exits
/// with its code): the control plane reads both back as a `WriteAnswer`. The control plane runs it (as the owner of PATH's directory) to
/// install a claimed session's environment, or a policy and its acknowledgement in one exec,
/// without an archive upload; for a warm-pool member it opens the exec ahead of the claim.
pub fn write_file(path: &Path, mode: u32, then: Option<&[&str]>) -> ExitCode {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let Some(name) = path.file_name() else {
        eprintln!("daiv-sandbox-helper: {} names no file", path.display());
        return ExitCode::from(2);
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
            println!("{WRITTEN}");
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
            println!("{}", exit_line(code));
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
        .take(WRITE_HEADER_MAX as u64)
        .read_until(b'\n', &mut line)?;
    if line.pop() != Some(b'\n') {
        return Err(bad("no complete header line"));
    }
    let header: WriteHeader =
        serde_json::from_slice(&line).map_err(|_| bad("malformed header line"))?;
    if header.len > WRITE_CONTENT_MAX {
        return Err(bad("content too large"));
    }
    let mut content = vec![0; header.len as usize];
    input.read_exact(&mut content)?;
    Ok((content, header.args))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let huge = format!("{{\"len\": {}}}\n", WRITE_CONTENT_MAX + 1);
        assert!(read_write_input(&mut huge.as_bytes()).is_err());
    }
}
