//! `GET {api}/docs`: Swagger UI on the OpenAPI document, as the reference's FastAPI app serves
//! it, to authorise with the API key and try every route from the browser.
//!
//! Everything the page loads is in the binary and served from `{api}/docs/`: Swagger UI's
//! release files (extracted by `build.rs` from the crate that vendors them) and our page and
//! initialiser (`docs/`). No CDN, so it works on a host with no internet, and a strict
//! Content-Security-Policy: scripts, styles and requests from this origin only, no inline
//! script. The page names its files and the document relatively, so it works at the root and
//! under the prefix alike, and behind a proxy that mounts the service elsewhere.
//!
//! # Why by hand, not `utoipa-swagger-ui`
//! Its page would meet the CSP (Swagger UI's own `index.html` loads files, no inline script)
//! with the headers added by a layer, but not the routes: it serves the UI at `{path}/` and
//! redirects `{path}` there with an absolute `Location`, and names the document by an absolute
//! URL it serves a copy of itself, so under the prefix or behind a proxy's mount the page
//! breaks, and `GET /docs` (200 here, as the reference's) would change. Its initialiser would
//! need our settings anyway (the base layout, no public validator, the key kept in memory
//! only). What remains is the files, which `build.rs` already takes from the crate that vendors
//! them, with no download at build time.

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// Same origin only, and nothing inline: Swagger UI's stylesheet draws its icons from `data:`
/// images; "Try it out" calls this service (`connect-src`). No frames, forms or base changes.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

const PAGE: &str = include_str!("docs/index.html");

/// One file under `{api}/docs/`.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

macro_rules! swagger_ui {
    ($file:literal) => {
        include_bytes!(concat!(env!("OUT_DIR"), "/swagger-ui/", $file))
    };
}

/// Every file the page loads, and Swagger UI's licence, which travels with its code.
static ASSETS: [Asset; 5] = [
    Asset {
        name: "swagger-ui-bundle.js",
        content_type: "text/javascript; charset=utf-8",
        body: swagger_ui!("swagger-ui-bundle.js"),
    },
    Asset {
        name: "swagger-ui.css",
        content_type: "text/css; charset=utf-8",
        body: swagger_ui!("swagger-ui.css"),
    },
    Asset {
        name: "favicon-32x32.png",
        content_type: "image/png",
        body: swagger_ui!("favicon-32x32.png"),
    },
    Asset {
        name: "init.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("docs/init.js"),
    },
    Asset {
        name: "LICENSE",
        content_type: "text/plain; charset=utf-8",
        // Swagger UI's NOTICE and licence (build.rs).
        body: swagger_ui!("LICENSE"),
    },
];

/// The page and its files; merged at the root and under the prefix like every route.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let mut router = Router::new()
        .route("/docs", get(page))
        // Relative names resolve from `/docs`, not `/docs/`: send the browser there.
        .route("/docs/", get(to_page));
    for asset in &ASSETS {
        router = router.route(
            &format!("/docs/{}", asset.name),
            get(move || async move { asset.response() }),
        );
    }
    router
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
        .into_response()
}

/// `../docs` from `{api}/docs/` is `{api}/docs`, whatever mounts the service.
async fn to_page() -> Response {
    (
        StatusCode::PERMANENT_REDIRECT,
        [(header::LOCATION, HeaderValue::from_static("../docs"))],
    )
        .into_response()
}

impl Asset {
    fn response(&self) -> Response {
        (
            [
                (header::CONTENT_TYPE, self.content_type),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                // Fixed for a build; an upgrade shows within the hour.
                (header::CACHE_CONTROL, "public, max-age=3600"),
            ],
            self.body,
        )
            .into_response()
    }
}
