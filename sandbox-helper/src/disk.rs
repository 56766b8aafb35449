//! The workspace's disk (`disk`): its filesystem's size, and what is allocated under it, by a
//! walk that never follows a symlink nor leaves the filesystem, bounded in entries.

use std::path::Path;

use sandbox_protocol::message::DiskInfo;

/// `root`'s filesystem size and the bytes allocated under `root` (entries it cannot read count
/// as nothing: the figure is a lower bound then, as it is past [`DiskInfo::MAX_ENTRIES`]).
pub fn usage(root: &Path) -> std::io::Result<DiskInfo> {
    let fs = rustix::fs::statvfs(root)?;
    let total_bytes = fs.f_blocks.saturating_mul(fs.f_frsize);
    let top = std::fs::symlink_metadata(root)?;
    let device = std::os::unix::fs::MetadataExt::dev(&top);
    let mut used = allocated(&top);
    let mut seen = 1u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > DiskInfo::MAX_ENTRIES {
                return Ok(DiskInfo {
                    total_bytes,
                    used_bytes: used,
                });
            }
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            used = used.saturating_add(allocated(&meta));
            if meta.is_dir() && std::os::unix::fs::MetadataExt::dev(&meta) == device {
                stack.push(entry.path());
            }
        }
    }
    Ok(DiskInfo {
        total_bytes,
        used_bytes: used,
    })
}

fn allocated(meta: &std::fs::Metadata) -> u64 {
    std::os::unix::fs::MetadataExt::blocks(meta).saturating_mul(512)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_is_allocated_not_holes() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let empty = usage(dir.path())?;
        std::fs::write(dir.path().join("data"), vec![1u8; 1 << 20])?;
        let sparse = std::fs::File::create(dir.path().join("sparse"))?;
        sparse.set_len(1 << 30)?;
        std::fs::create_dir(dir.path().join("sub"))?;
        std::os::unix::fs::symlink("/", dir.path().join("sub/root"))?;
        let after = usage(dir.path())?;
        let grew = after.used_bytes - empty.used_bytes;
        assert!(
            ((1 << 20)..(2 << 20)).contains(&grew),
            "1 MiB written, a 1 GiB hole, a link to /: {grew} bytes"
        );
        assert!(after.total_bytes >= after.used_bytes);
        Ok(())
    }
}
