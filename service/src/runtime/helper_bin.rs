//! The helper binary every sandbox gets: where the service finds it, and the check that it is
//! statically linked (a dynamically linked one cannot run in a busybox or shell-less image).

use std::path::{Path, PathBuf};

use crate::shared_file::SharedFile;

/// Reads the static helper binary the sandboxes get: `DAIV_SANDBOX_HELPER_BIN`, else
/// `daiv-sandbox-helper` beside this executable (the service image), else
/// `../helper/daiv-sandbox-helper` from it (`target/helper/`, where `make build` puts the static
/// build). A dynamically linked build is refused: it cannot run in a busybox or shell-less image.
/// What is checked and sent is a private copy ([`SharedFile`]): a rebuild of the file in place
/// while the service runs changes nothing it sends, and the binary is not in its memory.
pub fn helper_binary(configured: Option<&Path>) -> Result<SharedFile, String> {
    let candidates: Vec<PathBuf> = match configured {
        Some(p) => vec![p.to_path_buf()],
        None => {
            let exe_dir = std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(Path::to_path_buf))
                .unwrap_or_default();
            vec![
                exe_dir.join("daiv-sandbox-helper"),
                exe_dir.join("../helper/daiv-sandbox-helper"),
            ]
        }
    };
    let mut why = Vec::new();
    for path in &candidates {
        // The copy first, then its headers: what is checked is what is sent. Only a regular
        // file, and only so much of it (a FIFO or a device named by mistake is refused).
        let copy = std::fs::File::open(path).and_then(|f| {
            if !f.metadata()?.is_file() {
                return Err(std::io::Error::other("not a regular file"));
            }
            let copy = SharedFile::copy_of(&mut std::io::Read::take(f, HELPER_MAX + 1))?;
            if copy.len() > HELPER_MAX {
                return Err(std::io::Error::other(format!(
                    "over {} MiB: not a release build of the helper",
                    HELPER_MAX >> 20
                )));
            }
            Ok(copy)
        });
        let head = copy.and_then(|copy| {
            let head = copy.read_at(0, usize::try_from(copy.len().min(64 * 1024)).unwrap_or(0))?;
            Ok((copy, head))
        });
        match head.map(|(copy, h)| (copy, is_static_elf(&h))) {
            Ok((copy, Ok(true))) => {
                if copy.in_memory() {
                    tracing::warn!(
                        path = %path.display(),
                        "no temporary file could be made (a read-only root? set TMPDIR to a \
                         writable directory): the helper binary is held in memory"
                    );
                }
                return Ok(copy);
            }
            Ok((_, Ok(false))) => why.push(format!("{} is dynamically linked", path.display())),
            Ok((_, Err(e))) => why.push(format!("{}: {e}", path.display())),
            Err(e) => why.push(format!("{}: {e}", path.display())),
        }
    }
    Err(format!(
        "no static session helper binary ({}); build it with `make helper` or set DAIV_SANDBOX_HELPER_BIN",
        why.join("; ")
    ))
}

/// The largest helper binary taken (the static release build is under 4 MiB).
const HELPER_MAX: u64 = 64 << 20;

/// An x86-64/aarch64 ELF executable without a program interpreter (`PT_INTERP`).
fn is_static_elf(b: &[u8]) -> Result<bool, &'static str> {
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return Err("not a 64-bit little-endian ELF file");
    }
    let u16_at = |o: usize| b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]));
    let u64_at = |o: usize| {
        b.get(o..o + 8)
            .and_then(|s| <[u8; 8]>::try_from(s).ok())
            .map(u64::from_le_bytes)
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return Err("truncated ELF header");
    };
    for i in 0..usize::from(phnum) {
        let at = usize::try_from(phoff).map_err(|_| "bad program header offset")?
            + i * usize::from(phentsize);
        let p_type = b
            .get(at..at + 4)
            .and_then(|s| <[u8; 4]>::try_from(s).ok())
            .map(u32::from_le_bytes)
            .ok_or("truncated program headers")?;
        if p_type == 3 {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_executables_are_told_apart_from_static_ones() {
        // This test binary is dynamically linked (cargo's default on glibc).
        let exe = std::env::current_exe().and_then(std::fs::read);
        if let Ok(bytes) = exe {
            assert_eq!(is_static_elf(&bytes), Ok(false));
        }
        assert!(is_static_elf(b"#!/bin/sh\n").is_err());
        let missing = helper_binary(Some(Path::new("/nonexistent/helper")));
        assert!(missing.is_err_and(|e| e.contains("make helper")));
        let dir = helper_binary(Some(Path::new("/")));
        assert!(
            dir.is_err_and(|e| e.contains("not a regular file")),
            "a directory"
        );
    }
}
