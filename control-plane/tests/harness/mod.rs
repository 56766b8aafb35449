//! The one harness of the router tests (`router`, `workspace_router`, `pool_router`,
//! `reaper_router`): the app over the fake engine and in-process locks, driven in-process with
//! `oneshot`, so no test binary builds its own state or parses responses its own way. Each
//! binary adds what only it needs (multipart bodies, pool refills, a reaper) beside it.

// Each test binary compiles this module and uses part of it.
#![allow(dead_code)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use control_plane::config::{self, Config};
use control_plane::coordination::activity::SessionActivity;
use control_plane::coordination::lock::LocalLocks;
use control_plane::engine::fake::FakeEngine;
use control_plane::fleet::Cell;
use control_plane::ids::SessionId;
use control_plane::sessions::Sessions;
use control_plane::{AppState, app};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

/// The API key every harness is configured with.
pub const KEY: &str = "test-key";
/// The image sessions are created from (the fake engine has every image).
pub const IMAGE: &str = "img:1";

/// The test defaults with `extra` settings (names without the prefix) on top.
pub fn config(extra: &[(&str, &str)]) -> Arc<Config> {
    config::for_tests(KEY, extra)
}

/// `id` as the session id it is (a test's own ids always are).
pub fn sid(id: &str) -> SessionId {
    SessionId::parse(id).expect("a session id")
}

/// The app over a fake engine, and the engine to script and inspect it, with the in-process
/// locks it shares (to hold a session's lock from outside).
pub struct Harness {
    pub engine: FakeEngine,
    pub state: AppState,
    pub router: axum::Router,
    pub locks: Arc<LocalLocks>,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new(FakeEngine::default(), &[])
    }
}

impl Harness {
    /// The app over `engine` with `extra` settings.
    pub fn new(engine: FakeEngine, extra: &[(&str, &str)]) -> Self {
        let locks = Arc::new(LocalLocks::default());
        let state = AppState::new(config(extra), Arc::new(engine.clone()), locks.clone());
        Self::over(engine, state, locks)
    }

    /// The app over `engine` with `config` and an activity tracker of the test's own.
    pub fn with_activity(
        engine: FakeEngine,
        config: Arc<Config>,
        activity: Arc<dyn SessionActivity>,
    ) -> Self {
        let locks = Arc::new(LocalLocks::default());
        let state = AppState::with_coordination(
            config,
            Arc::new(engine.clone()),
            locks.clone(),
            activity,
            None,
        );
        Self::over(engine, state, locks)
    }

    fn over(engine: FakeEngine, state: AppState, locks: Arc<LocalLocks>) -> Self {
        Self {
            engine,
            router: app(state.clone()),
            state,
            locks,
        }
    }

    /// The one engine's cell: its sessions, warm pool and reaper.
    pub fn cell(&self) -> Arc<Cell> {
        self.state.fleet.default_cell().expect("one engine")
    }

    /// The one engine's sessions.
    pub fn sessions(&self) -> Arc<Sessions> {
        self.cell().sessions().clone()
    }

    /// Sends `req` through the app.
    pub async fn send(&self, req: Request<Body>) -> Response<Body> {
        match self.router.clone().oneshot(req).await {
            Ok(r) => r,
            Err(e) => match e {},
        }
    }

    /// `method uri` with an optional JSON body and API key: the status and the JSON answer.
    pub async fn call(
        &self,
        method: &str,
        uri: &str,
        body: Option<Value>,
        key: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(k) = key {
            req = req.header("x-api-key", k);
        }
        let body = match body {
            Some(v) => {
                req = req.header("content-type", "application/json");
                Body::from(v.to_string())
            }
            None => Body::empty(),
        };
        let resp = self.send(req.body(body).expect("request")).await;
        let status = resp.status();
        (status, json_body(resp).await)
    }

    /// [`Harness::call`] on an API route (`path` under `/api/v1`), with the key.
    pub async fn api(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        self.call(method, &format!("/api/v1{path}"), body, Some(KEY))
            .await
    }

    /// Creates a session from `body`; its id.
    pub async fn create(&self, body: Value) -> String {
        let (status, v) = self.api("POST", "/session/", Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v["session_id"].as_str().expect("session_id").to_string()
    }

    /// Creates a session from [`IMAGE`]; its id.
    pub async fn session(&self) -> String {
        self.create(json!({ "base_image": IMAGE })).await
    }
}

/// A response body as JSON: `Null` when empty, a JSON string when it is not JSON.
/// Whether the metrics page `text` has a request series of `door` for `route`.
pub fn has_request_series(text: &str, door: &str, route: &str) -> bool {
    text.lines().any(|l| {
        l.starts_with("daiv_sandbox_http_request_duration_seconds_count{")
            && l.contains(&format!("door=\"{door}\""))
            && l.contains(&format!("route=\"{route}\""))
    })
}

pub async fn json_body(resp: Response<Body>) -> Value {
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
}
