//! The OpenAPI document (`GET {api}/openapi.json`): [`ApiDoc`], beside the routes it lists, and
//! its post-processing ([`links`]: the links between operations; `bounds`: what the type
//! attributes cannot say).

mod bounds;
pub mod links;

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use utoipa::OpenApi;

use self::links::SessionLinks;
use crate::config::Config;

/// The document, its `servers` naming the configured prefix.
pub async fn document(State(config): State<Arc<Config>>) -> impl IntoResponse {
    let mut doc = ApiDoc::openapi();
    doc.servers = Some(vec![utoipa::openapi::Server::new(
        config.server.api_v1_str.clone(),
    )]);
    Json(doc)
}

#[derive(utoipa::OpenApi)]
#[openapi(
    info(title = "DAIV Runtime Sandbox", description = "Run commands in isolated per-session containers."),
    paths(
        crate::routes::session::create,
        crate::routes::session::run,
        crate::routes::session::status,
        crate::routes::session::close,
        crate::routes::inventory::list,
        crate::routes::inventory::info,
        crate::routes::inventory::timeout,
        crate::routes::inventory::metrics,
        crate::routes::egress::refresh,
        crate::routes::seed::seed,
        crate::routes::fs::ls,
        crate::routes::fs::read,
        crate::routes::fs::grep,
        crate::routes::fs::glob,
        crate::routes::fs::write,
        crate::routes::fs::edit,
        crate::routes::fs::delete,
        crate::routes::files::get_file,
        crate::routes::files::put_file,
        crate::routes::files::stat,
        crate::routes::files::mkdir,
        crate::routes::files::move_entry,
        crate::routes::files::list,
        crate::routes::watch::watch,
        crate::routes::processes::start,
        crate::routes::processes::list,
        crate::routes::processes::poll,
        crate::routes::processes::stdin,
        crate::routes::processes::events,
        crate::routes::processes::signal,
        crate::routes::processes::resize,
        crate::routes::processes::pty,
        crate::routes::processes::kill,
        crate::routes::snapshots::take,
        crate::routes::snapshots::list,
        crate::routes::snapshots::get,
        crate::routes::snapshots::delete,
        crate::routes::snapshots::fork,
        crate::routes::snapshots::pause,
        crate::routes::engines::list,
        crate::routes::meta::health,
        crate::routes::meta::version,
    ),
    modifiers(&ApiKeyScheme, &SessionLinks),
)]
pub struct ApiDoc;

/// `X-API-Key`, which the operations that need it name: the docs page's "Authorize" dialog
/// asks for it and its description.
struct ApiKeyScheme;

impl utoipa::Modify for ApiKeyScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-API-Key",
                "The service's key (`DAIV_SANDBOX_API_KEY`). Health and version need none.",
            ))),
        );
    }
}
