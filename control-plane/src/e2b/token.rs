//! envd's access token: one per sandbox, derived from the deployment's API key and the sandbox
//! id (HMAC-SHA256), so every replica and a restart agree on it without storing it, and a token
//! opens its own sandbox only. Changing the API key changes every token.

use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use ring::digest;
use subtle::ConstantTimeEq;

/// Keeps envd tokens apart from anything else the key may sign.
const LABEL: &[u8] = b"daiv-sandbox e2b envd token v1\0";

/// The metadata key that marks a sandbox whose ports are not public (kept out of its listing).
pub const PRIVATE_TRAFFIC: &str = "daiv.e2b.private-traffic";

#[derive(Clone)]
pub struct Tokens {
    tokens: crate::auth::SandboxTokens,
}

impl Tokens {
    pub fn new(api_key: &str) -> Self {
        Self {
            tokens: crate::auth::SandboxTokens::new(api_key, LABEL),
        }
    }

    /// The token of sandbox `id`.
    pub fn token(&self, id: &str) -> String {
        self.tokens.token(id)
    }

    /// Sandbox `id`'s traffic access token: what its ports take when it was created with
    /// `network.allowPublicTraffic: false` (see [`super::ports`]).
    pub fn traffic(&self, id: &str) -> String {
        self.token(&format!("traffic:{id}"))
    }

    /// Whether `given` is sandbox `id`'s token (constant time).
    pub fn check(&self, id: &str, given: &str) -> bool {
        self.tokens.check(id, given)
    }

    /// Whether `url` carries the signature the SDK makes for a `/files` URL of sandbox `id`:
    /// `v1_` and the unpadded base64 of SHA-256 over `path:operation:username:token` and, when the
    /// URL expires, `:expiration`. An expired URL is refused.
    pub fn check_signature(&self, id: &str, url: &SignedUrl<'_>, now_unix: i64) -> bool {
        if url.expiration.is_some_and(|e| e < now_unix) {
            return false;
        }
        let mut raw = format!(
            "{}:{}:{}:{}",
            url.path,
            url.operation,
            url.username,
            self.token(id)
        );
        if let Some(e) = url.expiration {
            raw.push_str(&format!(":{e}"));
        }
        let sum = digest::digest(&digest::SHA256, raw.as_bytes());
        let want = format!("v1_{}", STANDARD_NO_PAD.encode(sum.as_ref()));
        bool::from(want.as_bytes().ct_eq(url.signature.as_bytes()))
    }
}

/// What a signed `/files` URL says.
pub struct SignedUrl<'a> {
    pub signature: &'a str,
    pub path: &'a str,
    /// `read` or `write`.
    pub operation: &'a str,
    pub username: &'a str,
    pub expiration: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_opens_its_own_sandbox_only() {
        let t = Tokens::new("key");
        let a = t.token("a");
        assert!(t.check("a", &a));
        assert!(!t.check("b", &a));
        assert!(!Tokens::new("other").check("a", &a));
        assert!(!t.check("a", ""));
    }

    /// The SDK's own formula (e2b's `get_signature`), computed for a known token.
    #[test]
    fn a_signed_url_is_checked_as_the_sdk_signs_it() {
        let t = Tokens::new("key");
        let token = t.token("a");
        let raw = format!("/home/user/f:read::{token}:2000000000");
        let sum = digest::digest(&digest::SHA256, raw.as_bytes());
        let sig = format!("v1_{}", STANDARD_NO_PAD.encode(sum.as_ref()));
        let url = SignedUrl {
            signature: &sig,
            path: "/home/user/f",
            operation: "read",
            username: "",
            expiration: Some(2_000_000_000),
        };
        assert!(t.check_signature("a", &url, 1_900_000_000));
        assert!(!t.check_signature("a", &url, 2_000_000_001), "expired");
        assert!(
            !t.check_signature("b", &url, 1_900_000_000),
            "another sandbox"
        );
        let write = SignedUrl {
            operation: "write",
            ..url
        };
        assert!(
            !t.check_signature("a", &write, 1_900_000_000),
            "another operation"
        );
    }
}
