//! HTTP handlers: thin, one file per resource. Each parses its request, applies an operation
//! ([`crate::ops`], which takes the admission slot, the session's lock and the running check the
//! operation declares) and answers; a failure's status and body come from [`crate::error`]
//! through [`render`], never from here. [`extract`] parses the session id a path names, once;
//! [`admit::holding`] keeps what an operation holds until its answer has been sent.

pub mod admit;
pub mod code;
pub mod docs;
pub mod egress;
pub mod engines;
pub mod extract;
pub mod files;
pub mod fs;
pub mod inventory;
pub mod meta;
pub mod metrics;
pub mod observe;
pub mod openapi;
pub mod ports;
pub mod processes;
pub mod render;
pub mod seed;
pub mod session;
pub mod snapshots;
pub mod unread;
pub mod watch;

use std::sync::Arc;

use axum::Router;
use axum::extract::FromRef;
use axum::middleware;
use axum::routing::{delete, get, post, put};

use crate::config::Config;
use crate::telemetry::metrics::Metrics;

/// Every route of the API, answering both at the root and under `config.server.api_v1_str`, with
/// its layers: the key check, admission, the request observer and panics turned into 500s. Its
/// handlers take what they need from the state `S` (the sessions, the config, the metrics), so
/// the HTTP layer knows nothing of the composition that provides them.
pub fn router<S>(config: &Arc<Config>, metrics: &Arc<Metrics>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    crate::ops::Ops: FromRef<S>,
    Arc<Config>: FromRef<S>,
    Arc<crate::telemetry::runtime_probe::RuntimeHealth>: FromRef<S>,
{
    // Inside the key check (a route layer added below): a request without the key never takes a
    // slot.
    let mut api = Router::new();
    // A create takes a create slot (its operation does).
    api = both(api, "/session/", post(session::create));
    api = both(
        api,
        "/session/{session_id}/",
        get(session::status)
            .post(session::run)
            .delete(session::close),
    );
    api = both(api, "/session/{session_id}/egress/", put(egress::refresh));
    api = both(api, "/sessions/", get(inventory::list));
    api = both(api, "/session/{session_id}/info/", get(inventory::info));
    api = both(
        api,
        "/session/{session_id}/metrics/",
        get(inventory::metrics),
    );
    api = both(
        api,
        "/session/{session_id}/timeout/",
        post(inventory::timeout),
    );
    // A snapshot and a fork take a create slot (their operations do: each builds Docker
    // objects as a create does).
    api = both(
        api,
        "/session/{session_id}/snapshot/",
        post(snapshots::take),
    );
    api = both(api, "/session/{session_id}/fork/", post(snapshots::fork));
    api = both(api, "/session/{session_id}/pause/", post(snapshots::pause));
    api = both(api, "/snapshots/", get(snapshots::list));
    api = both(api, "/engines/", get(engines::list));
    api = both(
        api,
        "/snapshots/{snapshot_id}/",
        get(snapshots::get).delete(snapshots::delete),
    );
    // Seeds stream archives of any size: the body limit is SEED_MAX_BYTES, enforced as it flows;
    // the operation takes its seed slot (`ops::seed`).
    api = both(
        api,
        "/session/{session_id}/seed/",
        post(seed::seed).layer(axum::extract::DefaultBodyLimit::disable()),
    );
    for (op, handler) in [
        ("ls", post(fs::ls)),
        ("read", post(fs::read)),
        ("grep", post(fs::grep)),
        ("glob", post(fs::glob)),
        ("write", post(fs::write)),
        ("edit", post(fs::edit)),
        ("delete", post(fs::delete)),
    ] {
        api = both(api, &format!("/session/{{session_id}}/fs/{op}/"), handler);
    }
    // The data plane (ours): raw files of any size, streamed (the cap is FILE_MAX_BYTES,
    // enforced as the body flows), and the fs ops on paths anywhere.
    api = both(
        api,
        "/session/{session_id}/files",
        get(files::get_file)
            .put(files::put_file)
            .layer(axum::extract::DefaultBodyLimit::disable()),
    );
    // Operations (`crate::ops::fs`): each takes its fs slots itself, its body (a path or two)
    // read first.
    for (op, handler) in [
        ("stat", post(files::stat)),
        ("mkdir", post(files::mkdir)),
        ("move", post(files::move_entry)),
        ("list", post(files::list)),
    ] {
        api = both(api, &format!("/session/{{session_id}}/fs/{op}/"), handler);
    }
    api = both(api, "/session/{session_id}/watch", get(watch::watch));
    api = both(
        api,
        "/session/{session_id}/processes/",
        post(processes::start).get(processes::list),
    );
    api = both(
        api,
        "/session/{session_id}/processes/{process_id}/",
        get(processes::poll).delete(processes::kill),
    );
    api = both(
        api,
        "/session/{session_id}/processes/{process_id}/stdin",
        post(processes::stdin),
    );
    api = both(
        api,
        "/session/{session_id}/processes/{process_id}/events",
        get(processes::events),
    );
    api = both(
        api,
        "/session/{session_id}/processes/{process_id}/signal",
        post(processes::signal),
    );
    api = both(
        api,
        "/session/{session_id}/processes/{process_id}/resize",
        post(processes::resize),
    );
    api = both(
        api,
        "/session/{session_id}/processes/{process_id}/pty",
        get(processes::pty),
    );
    api = both(api, "/session/{session_id}/ports", get(ports::usage));
    // The code interpreter (relayed to the session's port 49999, its NDJSON streamed back).
    api = both(api, "/session/{session_id}/code", post(code::execute));
    api = both(
        api,
        "/session/{session_id}/code/contexts",
        get(code::contexts).post(code::contexts),
    );
    api = both(
        api,
        "/session/{session_id}/code/contexts/{context_id}",
        delete(code::context),
    );
    api = both(
        api,
        "/session/{session_id}/code/contexts/{context_id}/{action}",
        post(code::context_action),
    );
    api = api.route(
        "/session/{session_id}/ports/{port}/token",
        post(ports::token),
    );
    let api = api.route_layer(middleware::from_fn_with_state(
        config.clone(),
        render::require_api_key,
    ));
    // Ingress: the key or a port token, checked by the handler; bodies of any size streamed.
    let ingress = Router::new()
        .route(
            "/session/{session_id}/ports/{port}",
            axum::routing::any(ports::proxy_root),
        )
        .route(
            "/session/{session_id}/ports/{port}/",
            axum::routing::any(ports::proxy_root),
        )
        .route(
            "/session/{session_id}/ports/{port}/{*path}",
            axum::routing::any(ports::proxy),
        )
        .layer(axum::extract::DefaultBodyLimit::disable());
    let api = api.merge(ingress);

    let mut open = Router::new();
    open = both(open, "/-/health/", get(meta::health));
    open = both(open, "/-/version/", get(meta::version));
    open = open.route("/openapi.json", get(openapi::document));
    // Swagger UI at `/docs` (no trailing slash: it names `openapi.json` and its files relatively).
    let open = open.merge(docs::router());

    // Every route answers at the root and under the prefix, as the reference's FastAPI
    // `root_path` does (Starlette strips the root path only from paths that start with it):
    // DAIV's documented URL (`http://sandbox:8000`) has no prefix, other clients use it.
    let surface = api.merge(open);
    let prefix = config.server.api_v1_str.clone();
    let router = if prefix.is_empty() {
        surface
    } else {
        Router::new().nest(&prefix, surface.clone()).merge(surface)
    };
    let mut scrape = Router::new().route("/metrics", get(self::metrics::metrics));
    if !config.server.metrics_public {
        scrape = scrape.route_layer(middleware::from_fn_with_state(
            config.clone(),
            render::require_api_key,
        ));
    }
    observe::observed(
        router.merge(scrape),
        metrics,
        &config.server.api_v1_str,
        observe::Door::Rest,
    )
}

/// Registers `path` with and without its trailing slash: clients use both, and redirects would
/// turn a POST into a GET in some of them. Not tower-http's `NormalizePathLayer`: it rewrites the
/// path before routing, so the matched route (the `route` label of the metrics and the request
/// log, which dashboards key on) would lose the documented trailing slash.
fn both<S: Clone + Send + Sync + 'static>(
    router: Router<S>,
    path: &str,
    method: axum::routing::MethodRouter<S>,
) -> Router<S> {
    let bare = path.trim_end_matches('/');
    let slashed = format!("{bare}/");
    router.route(bare, method.clone()).route(&slashed, method)
}
