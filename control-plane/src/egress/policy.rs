//! The policy file as the API takes it and the gateway reads it: parsing and validation (never
//! echoing the body's strings), and the tar archives of the gateway's config files.

use bytes::Bytes;
use shared_policy::PolicyFile;
use shared_policy::sidecar;

use super::EgressError;
use super::GATEWAY_UID;

/// Parses an `egress` body as the policy file and applies the API's validation. Parse errors
/// never echo the body's strings (see [`EgressError::MalformedPolicy`]).
pub fn parse_policy(value: &serde_json::Value) -> Result<PolicyFile, EgressError> {
    let file: PolicyFile =
        serde_json::from_value(value.clone()).map_err(EgressError::MalformedPolicy)?;
    shared_policy::validate_for_api(&file)?;
    Ok(file)
}

pub(super) fn policy_json(policy: &PolicyFile) -> Result<Bytes, EgressError> {
    serde_json::to_vec(policy)
        .map(Bytes::from)
        .map_err(EgressError::Encode)
}

/// The gateway's config files, owned by the gateway's user; `with_dir` adds the directory
/// entry itself (first creation).
pub(super) fn config_tar(files: &[(&str, Bytes, u32)], with_dir: bool) -> Bytes {
    config_tar_with(files, with_dir, None)
}

/// [`config_tar`], plus the session helper at its usual path (root-owned, as in a sandbox): a
/// warm-pool member's gateway gets it so a claim installs its policy with one exec instead of
/// an archive upload.
pub(super) fn config_tar_with(
    files: &[(&str, Bytes, u32)],
    with_dir: bool,
    helper: Option<&Bytes>,
) -> Bytes {
    let mut builder = tar::Builder::new(Vec::new());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let header = |kind: tar::EntryType, mode: u32, size: u64| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(u64::from(GATEWAY_UID));
        h.set_gid(u64::from(GATEWAY_UID));
        h.set_size(size);
        h.set_mtime(now);
        h
    };
    let prefix = if with_dir {
        format!("{}/", sidecar::CONFIG_DIR.trim_start_matches('/'))
    } else {
        String::new()
    };
    if with_dir {
        let mut h = header(tar::EntryType::Directory, 0o700, 0);
        let _ = builder.append_data(&mut h, &prefix, std::io::empty());
    }
    for (name, data, mode) in files {
        let mut h = header(tar::EntryType::Regular, *mode, data.len() as u64);
        let _ = builder.append_data(&mut h, format!("{prefix}{name}"), &data[..]);
    }
    if let Some(bin) = helper {
        let root = |kind: tar::EntryType, mode: u32, size: u64| {
            let mut h = header(kind, mode, size);
            h.set_uid(0);
            h.set_gid(0);
            h
        };
        let dir = crate::runtime::SANDBOX_DIR.trim_start_matches('/');
        let mut h = root(tar::EntryType::Directory, 0o755, 0);
        let _ = builder.append_data(&mut h, format!("{dir}/"), std::io::empty());
        let mut h = root(tar::EntryType::Regular, 0o755, bin.len() as u64);
        let _ = builder.append_data(
            &mut h,
            crate::runtime::HELPER_PATH.trim_start_matches('/'),
            &bin[..],
        );
    }
    Bytes::from(builder.into_inner().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parse_errors_never_echo_body_strings() {
        let body = json!({"policy": {"default": "ghp_supersecret"}});
        let Err(e @ EgressError::MalformedPolicy(_)) = parse_policy(&body) else {
            panic!("expected a malformed policy");
        };
        let msg = e.to_string();
        assert!(msg.starts_with("invalid egress policy: "), "{msg}");
        assert!(!msg.contains("ghp_supersecret"), "{msg}");
    }

    #[test]
    fn api_validation_applies() {
        let deny_nothing = json!({"policy": {"default": "deny", "rules": []}});
        assert!(matches!(
            parse_policy(&deny_nothing),
            Err(EgressError::InvalidPolicy(_))
        ));
        let unknown_secret = json!({"policy": {"rules": [{"host": "a.test", "inject": "nope"}]}});
        assert!(matches!(
            parse_policy(&unknown_secret),
            Err(EgressError::InvalidPolicy(_))
        ));
        let ok =
            json!({"policy": {"rules": [{"host": "*.a.test", "methods": ["get"]}]}, "extra": 1});
        let file = parse_policy(&ok).expect("valid");
        assert_eq!(file.policy.rules[0].methods, vec!["GET"]);
    }

    #[test]
    fn config_tar_is_owned_by_the_gateway_user() -> std::io::Result<()> {
        let tar_bytes = config_tar(&[("config.json", Bytes::from_static(b"{}"), 0o600)], true);
        let mut archive = tar::Archive::new(&tar_bytes[..]);
        for entry in archive.entries()? {
            let entry = entry?;
            assert_eq!(entry.header().uid()?, u64::from(GATEWAY_UID));
        }
        Ok(())
    }
}
