//! Ingress: reaching a server inside a sandbox through the service (`/session/{id}/ports/...`
//! and, with a preview domain, `{port}-{id}.{domain}`): the domain, the tokens' key, and the
//! bounds of a session's connections.

use std::time::Duration;

use super::parse::Parser;
use crate::secret::Secret;

#[derive(Debug, Clone)]
pub struct IngressConfig {
    /// `PREVIEW_DOMAIN`: requests for `{port}-{id}.{domain}` reach that port of that session
    /// (a wildcard DNS entry and the operator's TLS in front); unset, only the path route.
    pub preview_domain: Option<String>,
    /// `PREVIEW_SCHEME` (`https`, or `http` behind no TLS): the scheme of preview URLs.
    pub preview_scheme: String,
    /// `PORT_TOKEN_SECRET`: the key port tokens are signed with; rotating it revokes every
    /// token. Unset: the API key's (rotating the key revokes them too).
    pub token_secret: Option<Secret>,
    /// `PORT_STREAMS_MAX`: connections one session may have open at once (429 past it).
    pub streams_per_session: usize,
    /// `PORT_IDLE_SECONDS`: a connection with no byte either way for this long is closed.
    pub idle: Duration,
    /// `PORT_TOKEN_MAX_TTL_SECONDS`: the longest a port token may live (also its default).
    pub token_max_ttl: Duration,
}

impl IngressConfig {
    pub(super) fn load(p: &mut Parser<'_>) -> Self {
        let preview_domain = p
            .get("PREVIEW_DOMAIN")
            .map(|d| d.trim().trim_matches('.').to_ascii_lowercase())
            .filter(|d| !d.is_empty());
        if let Some(d) = &preview_domain
            && !d.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            })
        {
            let raw = d.clone();
            p.fail(
                "PREVIEW_DOMAIN",
                &raw,
                "expected a DNS name such as sandbox.example.com",
            );
        }
        let preview_scheme = p.choice(
            "PREVIEW_SCHEME",
            "https",
            &[("https", "https"), ("http", "http")],
        );
        let token_secret = p.get("PORT_TOKEN_SECRET").map(Secret::new);
        if token_secret.as_ref().is_some_and(|s| s.expose().len() < 16) {
            p.fail(
                "PORT_TOKEN_SECRET",
                "(hidden)",
                "must be at least 16 characters",
            );
        }
        let streams = p.parse_or::<usize>("PORT_STREAMS_MAX", 64);
        if !(1..=10_000).contains(&streams) {
            p.fail(
                "PORT_STREAMS_MAX",
                &streams.to_string(),
                "must be between 1 and 10000",
            );
        }
        let idle = p.seconds_or("PORT_IDLE_SECONDS", 300);
        if !(1..=86_400).contains(&idle.as_secs()) {
            p.fail(
                "PORT_IDLE_SECONDS",
                &idle.as_secs().to_string(),
                "must be between 1 and 86400",
            );
        }
        let token_max_ttl = p.seconds_or("PORT_TOKEN_MAX_TTL_SECONDS", 86_400);
        if !(60..=30 * 86_400).contains(&token_max_ttl.as_secs()) {
            p.fail(
                "PORT_TOKEN_MAX_TTL_SECONDS",
                &token_max_ttl.as_secs().to_string(),
                "must be between 60 and 2592000",
            );
        }
        Self {
            preview_domain,
            preview_scheme: preview_scheme.to_string(),
            token_secret,
            streams_per_session: streams.clamp(1, 10_000),
            idle: idle.clamp(Duration::from_secs(1), Duration::from_secs(86_400)),
            token_max_ttl: token_max_ttl
                .clamp(Duration::from_secs(60), Duration::from_secs(30 * 86_400)),
        }
    }
}
