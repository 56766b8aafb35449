//! daiv-sandbox's service: per-session containers, what runs in them, their egress and
//! snapshots, and the operations ([`ops`]) every front door applies to them. No HTTP framework
//! and no MCP here: the front doors (the `control-plane` crate: routes, MCP, E2B, composition)
//! decode a request, apply an operation and render its answer or its error class.
//!
//! # Layers
//! Each module imports only from the layers before it (`control-plane/tests/layering.rs` checks
//! it):
//! 1. **Leaves:** [`ids`], [`secret`], [`text`], [`time`], [`layout`] (the paths inside a sandbox, from the protocol
//!    crate), [`api`] (the wire types the API serves), [`archive`] (the tar archives the service
//!    builds itself), [`shared_file`] (a file those archives send without holding it in
//!    memory: the helper binary), [`endpoint`] (what an engine endpoint is), [`backoff`] (the one retry
//!    pacing), [`background`] (the one shape of background work: rounds in tasks of their own,
//!    a wait between them). `ids`, `secret`, `time`, `archive`, `shared_file` and `endpoint` are the `sandbox-common`
//!    crate's, which the engine crate shares.
//! 2. **Settings:** [`config`], validated all at once at start-up.
//! 3. **Infrastructure:** [`engine`] (the `sandbox-engine` crate: the container-engine seam, its
//!    Docker implementation, the registry credentials, the scoped and metered decorators, a
//!    fake), [`runtime`] (the session-runtime seam over the in-sandbox helper's channel),
//!    [`coordination`] (per-session locks and activity, in-process or over Redis), [`telemetry`]
//!    (metrics, logs, Sentry).
//! 4. **Egress and snapshots:** [`egress`], the one owner of a session's triad; [`snapshots`]
//!    (a session's filesystem as Docker objects, retention, copy-on-write workspaces).
//! 5. **Building a sandbox:** [`sandbox`] (validation, spec, skeleton, cold build).
//! 6. **The warm pool:** [`pool`] (claims and refill, over the same factory).
//! 7. **Sessions:** [`sessions`] (create = validate → claim → else reserve + build; find, run,
//!    close, refresh; the session lock).
//! 8. **Workspace and processes:** [`workspace`] (seed from a multipart body's bytes, fs ops),
//!    [`processes`] (background processes, streaming runs), [`reaper`].
//! 9. **The fleet:** [`fleet`] (one such stack per Docker engine, placement, health, the engines
//!    file).
//! 10. **Admission and errors:** [`admission`] (the slots of each class of work), [`error`]
//!     (the one place a cause becomes a class: status, stable code, retry-after; the doors
//!     render it), [`auth`] (the one key check, port tokens).
//! 11. **Operations:** [`ops`], one type per use case on a session, declaring its admission
//!     class, its lock and its running check, which [`ops::Ops::apply`] takes once: the way the
//!     doors reach a session.

pub mod admission;
pub mod api;
pub mod auth;
pub mod background;
pub mod backoff;
pub mod config;
pub mod coordination;
pub mod egress;
pub mod error;
pub mod fleet;
pub mod ops;
pub mod pool;
pub mod processes;
pub mod reaper;
pub mod runtime;
pub mod sandbox;
pub mod sessions;
pub mod snapshots;
pub mod telemetry;
pub mod text;
pub mod workspace;

// Modules of other crates, at the layer the table gives their names.
pub use sandbox_common::{archive, endpoint, ids, secret, shared_file, time};
pub use sandbox_engine as engine;
pub use sandbox_protocol::layout;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
