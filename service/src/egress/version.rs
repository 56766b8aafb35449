//! Policy versions: the label the control plane writes into a policy file and waits for the
//! gateway to report (the acknowledgement of an install).
//!
//! A version is an HMAC-SHA256 of the policy's content ([`PolicyFile::content`], secret values
//! included) under a key derived from the egress CA key: the CA key is per deployment, shared by
//! replicas and never in the sandbox, so the same policy gets the same version on every replica
//! and across restarts (audit lines of one policy group together), while the version tells
//! nothing about the secrets to whoever lacks the key. An unkeyed hash would not do: FNV-1a,
//! used before, inverts byte by byte, and any hash of a short secret can be checked against
//! guesses offline.

use ring::hmac;
use shared_policy::PolicyFile;

/// What a version starts with (the rest is 32 hex digits: the first 128 bits of the MAC).
pub const VERSION_PREFIX: &str = "hmac:";
/// Domain separation: the version key is derived from the CA key for this use only.
const KEY_LABEL: &[u8] = b"daiv-sandbox egress policy version key v1";

/// The deployment's version key.
pub struct PolicyVersions {
    key: hmac::Key,
}

impl PolicyVersions {
    /// The key for a deployment whose egress CA key (PEM, as read from its file) is `ca_key`.
    pub fn from_ca_key(ca_key: &[u8]) -> Self {
        let derived = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, ca_key), KEY_LABEL);
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref()),
        }
    }

    /// `policy` labelled with its version (any `version` it came with is replaced: the agent
    /// does not choose it).
    pub fn label(&self, policy: &PolicyFile) -> PolicyFile {
        let tag = hmac::sign(&self.key, &policy.content());
        let hex: String = tag.as_ref()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        policy
            .clone()
            .with_version(format!("{VERSION_PREFIX}{hex}"))
    }
}

impl std::fmt::Debug for PolicyVersions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PolicyVersions(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(secret: &str) -> PolicyFile {
        serde_json::from_value(serde_json::json!({
            "policy": {"rules": [{"host": "a.test", "inject": "t"}]},
            "secrets": {"t": {"header": "Authorization", "value": secret}}
        }))
        .expect("policy")
    }

    fn version(v: &PolicyVersions, p: &PolicyFile) -> String {
        v.label(p).version.expect("labelled")
    }

    /// Equal content, equal version under one key; a version is not a function of the content
    /// alone (another deployment's key gives another one), so it cannot be recomputed, inverted
    /// or checked against a guessed secret without the key.
    #[test]
    fn versions_are_keyed_and_label_the_content() {
        let ours = PolicyVersions::from_ca_key(b"-----BEGIN PRIVATE KEY-----\nA\n");
        let theirs = PolicyVersions::from_ca_key(b"-----BEGIN PRIVATE KEY-----\nB\n");
        let (a, b) = (policy("s3cr3t"), policy("s3cr3u"));
        let va = version(&ours, &a);
        assert!(va.starts_with(VERSION_PREFIX) && va.len() == VERSION_PREFIX.len() + 32);
        assert_eq!(va, version(&ours, &a.clone().with_version("agent-chosen")));
        assert_ne!(va, version(&ours, &b), "another secret is another policy");
        assert_ne!(va, version(&theirs, &a), "the key decides");
        // Unkeyed digests of the content are not the version.
        let content = a.content();
        let sha = ring::digest::digest(&ring::digest::SHA256, &content);
        let sha_hex: String = sha.as_ref()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert!(!va.ends_with(&sha_hex));
    }
}
