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
