//! What a gateway's config directory holds when it is created, as the archive that puts it
//! there (later policies are [`ServiceFile`](crate::runtime::ServiceFile)s: see `policy.rs`).

use bytes::Bytes;
use shared_policy::PolicyFile;
use shared_policy::sidecar;

use super::{EgressError, GATEWAY_UID};
use crate::archive::{Archive, Part, ROOT, entry_name};
use crate::layout;
use crate::shared_file::SharedFile;

/// A policy file's bytes, as the gateway reads them.
pub(super) fn policy_json(policy: &PolicyFile) -> Result<Bytes, EgressError> {
    serde_json::to_vec(policy)
        .map(Bytes::from)
        .map_err(EgressError::Encode)
}

/// The gateway's config directory as it is created: its files, owned by the gateway's user,
/// and for a warm-pool member's gateway the session helper at its usual path (root-owned, as in
/// a sandbox), so a claim installs its policy with one exec instead of an archive upload. In
/// parts: the helper is sent from its file, as in a sandbox's skeleton.
pub(super) fn config_tar(files: &[(&str, Bytes, u32)], helper: Option<&SharedFile>) -> Vec<Part> {
    let gateway = (GATEWAY_UID, GATEWAY_UID);
    let mut tar = Archive::new();
    let prefix = format!("{}/", entry_name(sidecar::CONFIG_DIR));
    tar.dir(&prefix, 0o700, gateway);
    for (name, data, mode) in files {
        tar.file(&format!("{prefix}{name}"), *mode, gateway, data);
    }
    if let Some(bin) = helper {
        tar.dir(entry_name(layout::SERVICE_DIR), 0o755, ROOT)
            .shared_file(entry_name(layout::HELPER), 0o755, ROOT, bin.clone());
    }
    // The names are constants and the policy files' fixed names: nothing `tar` refuses.
    tar.finish_parts().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_tar_is_owned_by_the_gateway_user() -> std::io::Result<()> {
        let parts = config_tar(&[("config.json", Bytes::from_static(b"{}"), 0o600)], None);
        let tar_bytes = crate::archive::concat(&parts)?;
        let mut archive = tar::Archive::new(&tar_bytes[..]);
        for entry in archive.entries()? {
            let entry = entry?;
            assert_eq!(entry.header().uid()?, u64::from(GATEWAY_UID));
        }
        Ok(())
    }
}
