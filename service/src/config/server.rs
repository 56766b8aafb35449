//! The HTTP surface: where the service listens, the key clients send and the path prefix.

use std::net::IpAddr;

use super::parse::Parser;
use super::{PREFIX, Secret};

/// First path segments of the routes served at the root.
const ROOT_SEGMENTS: [&str; 5] = ["session", "-", "docs", "openapi.json", "metrics"];

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: IpAddr,
    pub port: u16,
    pub api_key: Secret,
    /// The prefix every session route is nested under (`API_V1_STR`, no trailing slash); empty =
    /// the root.
    pub api_v1_str: String,
    /// `GET /metrics` without the API key (for scrapers that cannot send a header).
    pub metrics_public: bool,
}

impl ServerConfig {
    pub(super) fn load(p: &mut Parser<'_>) -> Self {
        let api_key = p.get("API_KEY").map(Secret::new);
        if api_key.is_none() {
            p.errors.push(format!(
                "{PREFIX}API_KEY: required (the key clients send in X-API-Key)"
            ));
        }

        let api_v1_str = p.string_or("API_V1_STR", "/api/v1");
        let api_v1_str = api_v1_str.trim_end_matches('/').to_string();
        if !api_v1_str.is_empty()
            && (!api_v1_str.starts_with('/')
                || !api_v1_str
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/-_.~".contains(c)))
        {
            let raw = api_v1_str.clone();
            p.fail("API_V1_STR", &raw, "expected a path such as /api/v1");
        } else if let Some(first) = api_v1_str.split('/').nth(1)
            && ROOT_SEGMENTS.contains(&first)
        {
            // Routes answer at the root too: a prefix that starts like one of them would make
            // `{prefix}/...` and a route at the root the same path.
            let raw = api_v1_str.clone();
            p.fail(
                "API_V1_STR",
                &raw,
                "must not start with a route's first segment (session, -, docs, openapi.json, metrics)",
            );
        }

        let host = p.parse_or::<IpAddr>("HOST", IpAddr::from([0, 0, 0, 0]));
        let port = p.parse_or::<u16>("PORT", 8000);
        let metrics_public = p.bool_or("METRICS_PUBLIC", false);

        Self {
            host,
            port,
            // Missing is already an error: `load` never returns this placeholder.
            api_key: api_key.unwrap_or_else(|| Secret::new("")),
            api_v1_str,
            metrics_public,
        }
    }
}
