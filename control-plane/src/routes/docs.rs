//! `GET {api}/docs`: a human-readable page for the OpenAPI document.
//!
//! One self-contained HTML file (inline CSS and script, no CDN, no fonts) that fetches the
//! `openapi.json` next to it and renders routes, parameters, bodies, responses and schemas:
//! it works on an air-gapped host and adds nothing to the build.

use axum::http::header;
use axum::response::IntoResponse;

const PAGE: &str = include_str!("docs.html");

pub async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // The page runs only its own inline script and fetches only from this origin.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
            ),
        ],
        PAGE,
    )
}
