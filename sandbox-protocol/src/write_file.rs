//! The input of the helper's `write-file PATH MODE [-- CMD...]`: how the control plane puts a
//! root-owned file (a claim's environment, a policy and its acknowledgement) into a container
//! in one exec, without an archive upload.

use serde::{Deserialize, Serialize};

/// Largest header line of `write-file`'s input.
pub const WRITE_HEADER_MAX: usize = 4096;
/// Largest content `write-file` takes (the header's `len`).
pub const WRITE_CONTENT_MAX: u64 = 16 * 1024 * 1024;

/// `write-file`'s input: this header as one JSON line, then exactly `len` bytes of content.
/// Input that ends before the content is complete writes nothing, so a writer opened ahead of
/// use (a warm-pool member's) and dropped unused never touches its file; nor does `write-file`
/// wait for the end of its input (a half-close the engine's attach stream may not carry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteHeader {
    pub len: u64,
    /// Appended to the command run after the write (a value known only when writing).
    #[serde(default)]
    pub args: Vec<String>,
}

impl WriteHeader {
    /// The header line and `content`, ready for `write-file`'s stdin.
    pub fn frame(content: &[u8], args: Vec<String>) -> Vec<u8> {
        let header = Self {
            len: content.len() as u64,
            args,
        };
        let mut out = serde_json::to_vec(&header).unwrap_or_default();
        out.push(b'\n');
        out.extend_from_slice(content);
        out
    }
}

/// The line `write-file` prints once the file is in place.
pub const WRITTEN: &str = "ok";

/// The line `write-file` prints after the command that followed the write exited with `code`.
pub fn exit_line(code: i32) -> String {
    format!("exit {code}")
}

/// What a `write-file` exec printed, read back: whether the file was written (its first line)
/// and, when a command followed, its exit code (its last line, which the helper prints after
/// the command's own output: an `exit` line the command printed earlier is not the answer).
/// Anything else it printed is ignored; the last such line is kept for a log (it comes from the
/// container: never for a client's body).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WriteAnswer {
    pub written: bool,
    pub exit: Option<i32>,
    pub last_other: Option<String>,
}

impl WriteAnswer {
    /// Reads `output`: all of it, or its head and its tail (see [`WriteAnswer::parse_cut`]).
    pub fn parse(output: &[u8]) -> Self {
        Self::parse_cut(output, &[])
    }

    /// Reads the output of an exec that printed more than was kept: its first bytes (`head`)
    /// and its last (`tail`, empty when `head` is all of it).
    pub fn parse_cut(head: &[u8], tail: &[u8]) -> Self {
        let head = String::from_utf8_lossy(head);
        let tail = String::from_utf8_lossy(tail);
        let lines: Vec<&str> = head
            .lines()
            .chain(tail.lines())
            .map(str::trim_end)
            .filter(|l| !l.is_empty())
            .collect();
        let written = lines.first() == Some(&WRITTEN);
        let exit = lines
            .last()
            .filter(|_| written && lines.len() > 1)
            .and_then(|l| l.strip_prefix("exit "))
            .and_then(|c| c.parse::<i32>().ok());
        let body = &lines[usize::from(written)..lines.len() - usize::from(exit.is_some())];
        Self {
            written,
            exit,
            last_other: body.last().map(|l| l.chars().take(200).collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_read_back() {
        let both = format!("{WRITTEN}\nversion v1 not yet\n{}\n", exit_line(3));
        assert_eq!(
            WriteAnswer::parse(both.as_bytes()),
            WriteAnswer {
                written: true,
                exit: Some(3),
                last_other: Some("version v1 not yet".into()),
            }
        );
        // An exit line before the write is the command's own output, not an answer.
        let forged = WriteAnswer::parse(b"exit 0\n");
        assert_eq!((forged.written, forged.exit), (false, None));
        // Nor is one the command printed before its real end.
        let early = WriteAnswer::parse(b"ok\nexit 0\nnot yet\nexit 1\n");
        assert_eq!(early.exit, Some(1));
        let unfinished = WriteAnswer::parse(b"ok\nexit 0\nstill checking\n");
        assert_eq!(unfinished.exit, None);
        // Output cut in the middle: the answer's last line is in the tail.
        let cut = WriteAnswer::parse_cut(b"ok\nexit 0\nnoise", b"noise\nexit 2\n");
        assert_eq!((cut.written, cut.exit), (true, Some(2)));
        let failed = WriteAnswer::parse(b"daiv-sandbox-helper: cannot write /x: EACCES\n");
        assert!(!failed.written);
    }
}
