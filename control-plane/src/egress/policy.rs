//! The policy file as the API takes it and the gateway reads it: parsing and validation (never
//! echoing the body's strings), and the tar archives of the gateway's config files.

use bytes::Bytes;
use shared_policy::PolicyFile;
use shared_policy::sidecar;

use super::GATEWAY_UID;
use crate::archive::{Archive, ROOT, entry_name};
use crate::error::ApiError;
use crate::layout;

/// Parses an `egress` body as the policy file and applies the API's validation. Parse errors
/// never echo the body's strings: a misplaced secret must not come back in a 422.
pub fn parse_policy(value: &serde_json::Value) -> Result<PolicyFile, ApiError> {
    let file: PolicyFile = serde_json::from_value(value.clone()).map_err(|e| {
        ApiError::Unprocessable(format!("invalid egress policy: {}", redact(&e.to_string())))
    })?;
    shared_policy::validate_for_api(&file)
        .map_err(|e| ApiError::Unprocessable(format!("invalid egress policy: {e}")))?;
    Ok(file)
}

/// Blanks quoted and back-ticked spans of a serde message.
fn redact(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut inside: Option<char> = None;
    for ch in message.chars() {
        match inside {
            Some(close) if ch == close => {
                out.push('…');
                out.push(ch);
                inside = None;
            }
            Some(_) => {}
            None if ch == '`' || ch == '"' => {
                out.push(ch);
                inside = Some(ch);
            }
            None => out.push(ch),
        }
    }
    out
}

pub(super) fn policy_json(policy: &PolicyFile) -> Result<Bytes, ApiError> {
    serde_json::to_vec(policy)
        .map(Bytes::from)
        .map_err(|e| ApiError::Internal(e.into()))
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
    let gateway = (GATEWAY_UID, GATEWAY_UID);
    let mut tar = Archive::new();
    let prefix = if with_dir {
        format!("{}/", entry_name(sidecar::CONFIG_DIR))
    } else {
        String::new()
    };
    if with_dir {
        tar.dir(&prefix, 0o700, gateway);
    }
    for (name, data, mode) in files {
        tar.file(&format!("{prefix}{name}"), *mode, gateway, data);
    }
    if let Some(bin) = helper {
        tar.dir(entry_name(layout::SERVICE_DIR), 0o755, ROOT).file(
            entry_name(layout::HELPER),
            0o755,
            ROOT,
            bin,
        );
    }
    // The names are constants and the policy files' fixed names: nothing `tar` refuses.
    tar.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parse_errors_never_echo_body_strings() {
        let body = json!({"policy": {"default": "ghp_supersecret"}});
        let Err(ApiError::Unprocessable(msg)) = parse_policy(&body) else {
            panic!("expected 422");
        };
        assert!(!msg.contains("ghp_supersecret"), "{msg}");
    }

    #[test]
    fn api_validation_applies() {
        let deny_nothing = json!({"policy": {"default": "deny", "rules": []}});
        assert!(matches!(
            parse_policy(&deny_nothing),
            Err(ApiError::Unprocessable(_))
        ));
        let unknown_secret = json!({"policy": {"rules": [{"host": "a.test", "inject": "nope"}]}});
        assert!(matches!(
            parse_policy(&unknown_secret),
            Err(ApiError::Unprocessable(_))
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
