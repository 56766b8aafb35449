//! `X-API-Key` authentication for every door (health and version stay open), the per-sandbox
//! tokens of the doors whose daemons take one (E2B's envd, OpenSandbox's execd), and port tokens.

use subtle::ConstantTimeEq;

use crate::config::Config;
use crate::error::ApiError;

pub const HEADER: &str = "x-api-key";

/// Why a presented key was refused; each door renders it its own way (REST's 401/403
/// `{"detail"}`, MCP's with `WWW-Authenticate`, E2B's 401 `{code, message}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRefusal {
    Missing,
    Invalid,
}

/// The one check of a key a door was given against the deployment's: every door calls it.
/// Constant-time over the bytes; a length mismatch is not secret.
pub fn check_key(config: &Config, given: Option<&[u8]>) -> Result<(), KeyRefusal> {
    let given = given.ok_or(KeyRefusal::Missing)?;
    let expected = config.server.api_key.expose().as_bytes();
    if bool::from(given.ct_eq(expected)) {
        Ok(())
    } else {
        Err(KeyRefusal::Invalid)
    }
}

/// The class of a refused key, for the doors that answer it as an error (the routes' 403
/// `{"detail"}`).
impl From<KeyRefusal> for ApiError {
    fn from(e: KeyRefusal) -> Self {
        match e {
            KeyRefusal::Missing => ApiError::MissingApiKey,
            KeyRefusal::Invalid => ApiError::InvalidApiKey,
        }
    }
}

/// A door's per-sandbox token: HMAC-SHA256 over the door's label and the sandbox id, keyed by
/// the deployment's API key, so every replica and a restart agree on it without storing it, a
/// token opens its own sandbox only, and changing the key changes every token. The label keeps
/// one door's tokens apart from another's.
#[derive(Clone)]
pub struct SandboxTokens {
    key: ring::hmac::Key,
    label: &'static [u8],
}

impl SandboxTokens {
    pub fn new(api_key: &str, label: &'static [u8]) -> Self {
        Self {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, api_key.as_bytes()),
            label,
        }
    }

    /// The token of sandbox `id`.
    pub fn token(&self, id: &str) -> String {
        use base64::Engine;
        let mut ctx = ring::hmac::Context::with_key(&self.key);
        ctx.update(self.label);
        ctx.update(id.as_bytes());
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(ctx.sign().as_ref())
    }

    /// Whether `given` is sandbox `id`'s token (constant time).
    pub fn check(&self, id: &str, given: &str) -> bool {
        bool::from(self.token(id).as_bytes().ct_eq(given.as_bytes()))
    }
}

/// Port tokens (ingress): a session's port opened to whoever holds one, checked without a lookup
/// (HMAC-SHA256 over the session, the port and the expiry, with the deployment's
/// `PORT_TOKEN_SECRET`, else its API key): rotating that key revokes every token.
pub mod port_token {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use ring::hmac;
    use subtle::ConstantTimeEq;

    use crate::config::Config;

    /// Keeps port tokens apart from anything else the key signs.
    const LABEL: &[u8] = b"daiv-sandbox port token v1\0";
    /// The header a client sends a token in.
    pub const HEADER: &str = "x-daiv-port-token";
    /// The query parameter a browser's first request carries it in (exchanged for the cookie).
    pub const QUERY: &str = "daiv_port_token";
    /// The cookie that carries it after.
    pub const COOKIE: &str = "daiv_port_token";

    fn key(config: &Config) -> hmac::Key {
        let secret = match &config.ingress.token_secret {
            Some(s) => s.expose(),
            None => config.server.api_key.expose(),
        };
        hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes())
    }

    fn sign(config: &Config, session: &str, port: u16, expires: i64) -> String {
        let mut ctx = hmac::Context::with_key(&key(config));
        ctx.update(LABEL);
        ctx.update(session.as_bytes());
        ctx.update(b"\0");
        ctx.update(&port.to_be_bytes());
        ctx.update(&expires.to_be_bytes());
        URL_SAFE_NO_PAD.encode(ctx.sign().as_ref())
    }

    /// A token for `port` of `session` until unix time `expires`: `{expires}.{signature}`.
    pub fn issue(config: &Config, session: &str, port: u16, expires: i64) -> String {
        format!("{expires}.{}", sign(config, session, port, expires))
    }

    /// Whether `token` opens `port` of `session` at unix time `now` (constant time over the
    /// signature).
    pub fn check(config: &Config, session: &str, port: u16, token: &str, now: i64) -> bool {
        let Some((expires, sig)) = token.split_once('.') else {
            return false;
        };
        let Ok(expires) = expires.parse::<i64>() else {
            return false;
        };
        if expires < now {
            return false;
        }
        let want = sign(config, session, port, expires);
        bool::from(want.as_bytes().ct_eq(sig.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_token_opens_its_own_sandbox_of_its_own_door_only() {
        let a = SandboxTokens::new("key", b"door a\0");
        let t = a.token("abc");
        assert!(a.check("abc", &t));
        assert!(!a.check("abd", &t));
        assert!(!SandboxTokens::new("other", b"door a\0").check("abc", &t));
        assert!(!SandboxTokens::new("key", b"door b\0").check("abc", &t));
    }
}
