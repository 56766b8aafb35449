//! `daiv-code-interpreter [--port N] [--cwd DIR]`: the code interpreter a sandbox's image starts
//! (see `DAIV_SANDBOX_START` in the docs): E2B's code-interpreter wire on 127.0.0.1:N (49999 by
//! default), which the service's ingress relays to, over one Jupyter kernel per context. It runs
//! as the sandbox user, like every command.
//!
//! Rust, over the runtimed project's `jupyter-zmq-client` (Jupyter's messaging protocol on a
//! pure-Rust ZeroMQ): a few MiB resident beside the kernels, where a Python server would carry its
//! own interpreter and libraries in every sandbox, and no Python package of ours to keep beside
//! the image's.

mod kernel;
mod wire;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use kernel::Context;

/// Contexts a sandbox may hold at once (each is a kernel process).
const MAX_CONTEXTS: usize = 32;

struct Server {
    contexts: Mutex<BTreeMap<String, Arc<Context>>>,
    /// The context an execution without `context_id` runs in, per language.
    defaults: Mutex<BTreeMap<String, String>>,
    cwd: String,
    runtime_dir: PathBuf,
}

type Shared = Arc<Server>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A refusal: its status and `{"detail"}`.
struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, axum::Json(json!({ "detail": self.1 }))).into_response()
    }
}

fn detail(status: StatusCode, why: impl Into<String>) -> Response {
    Refusal(status, why.into()).into_response()
}

impl Server {
    fn context(&self, id: &str) -> Option<Arc<Context>> {
        lock(&self.contexts).get(id).cloned()
    }

    fn create(&self, language: String, cwd: String) -> Result<Arc<Context>, Refusal> {
        if !kernel::known_language(&language) {
            return Err(Refusal(
                StatusCode::BAD_REQUEST,
                format!("no kernel for language {language:?}: python and bash are served"),
            ));
        }
        if !std::path::Path::new(&cwd).is_dir() {
            return Err(Refusal(
                StatusCode::BAD_REQUEST,
                format!("cwd {cwd:?} is not a directory in the sandbox"),
            ));
        }
        let mut contexts = lock(&self.contexts);
        if contexts.len() >= MAX_CONTEXTS {
            return Err(Refusal(
                StatusCode::TOO_MANY_REQUESTS,
                format!("a sandbox holds at most {MAX_CONTEXTS} contexts: delete one first"),
            ));
        }
        let id = uuid::Uuid::new_v4().to_string();
        let ctx = Context::new(id.clone(), language, cwd, self.runtime_dir.clone());
        contexts.insert(id, ctx.clone());
        Ok(ctx)
    }

    /// The default context of `language`, made on first use.
    fn default_for(&self, language: &str) -> Result<Arc<Context>, Refusal> {
        let mut defaults = lock(&self.defaults);
        if let Some(ctx) = defaults.get(language).and_then(|id| self.context(id)) {
            return Ok(ctx);
        }
        let ctx = self.create(language.to_string(), self.cwd.clone())?;
        defaults.insert(language.to_string(), ctx.id.clone());
        Ok(ctx)
    }
}

fn parse<T: serde::de::DeserializeOwned + Default>(body: &Bytes) -> Result<T, Refusal> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| Refusal(StatusCode::BAD_REQUEST, format!("invalid body: {e}")))
}

async fn execute(State(s): State<Shared>, body: Bytes) -> Response {
    let body: wire::ExecuteBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return detail(StatusCode::BAD_REQUEST, format!("invalid body: {e}")),
    };
    if body.context_id.is_some() && body.language.is_some() {
        return detail(
            StatusCode::BAD_REQUEST,
            "give context_id or language, not both",
        );
    }
    let env = body.env_vars.unwrap_or_default();
    if let Some(bad) = env.keys().find(|k| !wire::valid_env_name(k)) {
        return detail(
            StatusCode::BAD_REQUEST,
            format!("env_vars: {bad:?} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"),
        );
    }
    let timeout = match body.timeout {
        None => None,
        Some(t) if t.is_finite() && t > 0.0 && t <= 86_400.0 => Some(Duration::from_secs_f64(t)),
        Some(_) => {
            return detail(
                StatusCode::BAD_REQUEST,
                "timeout must be seconds above 0, at most a day",
            );
        }
    };
    let ctx = match &body.context_id {
        Some(id) => match s.context(id) {
            Some(c) => c,
            None => return detail(StatusCode::NOT_FOUND, format!("no context {id}")),
        },
        None => match s.default_for(&wire::language(body.language.as_deref())) {
            Ok(c) => c,
            Err(r) => return r.into_response(),
        },
    };
    let (tx, rx) = mpsc::unbounded_channel::<Value>();
    // Its own task: a caller that goes away interrupts the execution, which still runs to its
    // end so the context stays usable.
    tokio::spawn(ctx.execute(body.code, env, timeout, tx));
    let lines = futures::stream::unfold(rx, |mut rx| async move {
        let line = rx.recv().await?;
        let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
        bytes.push(b'\n');
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(bytes)), rx))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(lines))
        .unwrap_or_else(|_| detail(StatusCode::INTERNAL_SERVER_ERROR, "response"))
}

async fn create_context(State(s): State<Shared>, body: Bytes) -> Response {
    let body: wire::ContextBody = match parse(&body) {
        Ok(b) => b,
        Err(r) => return r.into_response(),
    };
    let language = wire::language(body.language.as_deref());
    let cwd = body.cwd.unwrap_or_else(|| s.cwd.clone());
    let ctx = match s.create(language, cwd) {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    if let Err(e) = ctx.ensure_started().await {
        lock(&s.contexts).remove(&ctx.id);
        return detail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    }
    axum::Json(ctx.info()).into_response()
}

async fn list_contexts(State(s): State<Shared>) -> Response {
    let list: Vec<wire::ContextInfo> = lock(&s.contexts).values().map(|c| c.info()).collect();
    axum::Json(list).into_response()
}

async fn delete_context(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    let Some(ctx) = lock(&s.contexts).remove(&id) else {
        return detail(StatusCode::NOT_FOUND, format!("no context {id}"));
    };
    lock(&s.defaults).retain(|_, v| *v != id);
    ctx.shutdown().await;
    StatusCode::NO_CONTENT.into_response()
}

async fn restart_context(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    let Some(ctx) = s.context(&id) else {
        return detail(StatusCode::NOT_FOUND, format!("no context {id}"));
    };
    match ctx.restart().await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => detail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn interrupt_context(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    let Some(ctx) = s.context(&id) else {
        return detail(StatusCode::NOT_FOUND, format!("no context {id}"));
    };
    ctx.interrupt();
    StatusCode::NO_CONTENT.into_response()
}

fn router(server: Shared) -> Router {
    Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/execute", post(execute))
        .route("/contexts", post(create_context).get(list_contexts))
        .route("/contexts/{id}", delete(delete_context))
        .route("/contexts/{id}/restart", post(restart_context))
        .route("/contexts/{id}/interrupt", post(interrupt_context))
        .with_state(server)
}

struct Args {
    port: u16,
    cwd: String,
}

fn args() -> Result<Args, String> {
    let mut out = Args {
        port: 49999,
        cwd: std::env::var("HOME").unwrap_or_else(|_| "/".into()),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--port" => {
                out.port = it
                    .next()
                    .and_then(|p| p.parse().ok())
                    .ok_or("--port takes a port number")?;
            }
            "--cwd" => out.cwd = it.next().ok_or("--cwd takes a directory")?,
            "--version" => {
                println!("daiv-code-interpreter {}", env!("CARGO_PKG_VERSION"));
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(out)
}

fn main() -> std::process::ExitCode {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "daiv-code-interpreter: {e}\nusage: daiv-code-interpreter [--port N] [--cwd DIR]"
            );
            return std::process::ExitCode::from(2);
        }
    };
    // One thread: the kernels do the work; this only relays their messages.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("daiv-code-interpreter: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    match rt.block_on(serve(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("daiv-code-interpreter: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

async fn serve(args: Args) -> std::io::Result<()> {
    let runtime_dir = std::env::temp_dir().join(format!(
        "daiv-code-interpreter-{}",
        uuid::Uuid::new_v4().simple()
    ));
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&runtime_dir)?;
    }
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
    let server = Arc::new(Server {
        contexts: Mutex::new(BTreeMap::new()),
        defaults: Mutex::new(BTreeMap::new()),
        cwd: args.cwd,
        runtime_dir,
    });
    // The default Python context starts now, so the first execution finds it warm (a warm-pool
    // member starts it before it is claimed).
    if let Ok(ctx) = server.default_for("python") {
        tokio::spawn(async move {
            if let Err(e) = ctx.ensure_started().await {
                eprintln!("daiv-code-interpreter: the default context: {e}");
            }
        });
    }
    axum::serve(listener, router(server)).await
}
