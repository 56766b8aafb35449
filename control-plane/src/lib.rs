//! daiv-sandbox control plane: the front doors of the service (its REST routes, MCP, E2B's and
//! OpenSandbox's APIs)
//! and the composition that serves them. The domain and the operations on a session are the
//! `sandbox-service` crate's: a door decodes a request, applies an operation and renders its
//! answer or its error's class, and Cargo keeps the service free of HTTP and MCP.
//!
//! # Layers
//! The service's modules are re-exported at the root in their layers (the service crate's
//! `lib.rs` draws layers 1 to 11: leaves, settings, infrastructure, egress and snapshots,
//! building a sandbox, the warm pool, sessions, workspace and processes, the fleet, admission
//! and errors, operations). This crate adds, each importing only from the layers before it
//! (`tests/layering.rs` checks it):
//! 12. **HTTP:** [`routes`] (handlers, the router, the rendering of an error class as
//!     `{"detail"}` and the extractors that answer bad input alike, the API key check, and the
//!     OpenAPI document beside the routes it lists; ingress's door, `routes::ports`, which every
//!     door's port traffic goes through).
//! 13. **Other APIs:** [`mcp`] (the sandbox as MCP tools at `/mcp` and over stdio, through the
//!     same operations as the routes); [`e2b`] (E2B's control API and envd on a
//!     port of their own, every call decoded into the same operations: none is a request to
//!     the service's own router); [`opensandbox`] (OpenSandbox's lifecycle API and execd on a
//!     port of their own, likewise).
//! 14. **Composition:** [`state`] ([`AppState`] and [`app`]), [`serve`] (the service's life from
//!     settings and a listener to shutdown); `main.rs`.

pub mod e2b;
pub mod mcp;
pub mod opensandbox;
pub mod routes;
pub mod serve;
pub mod state;

// The service's modules, at the layer the table of its `lib.rs` gives their names.
pub use sandbox_service::{
    admission, api, archive, auth, background, backoff, config, coordination, egress, endpoint,
    engine, error, fleet, ids, layout, ops, pool, processes, reaper, runtime, sandbox, secret,
    sessions, shared_file, snapshots, telemetry, text, time, workspace,
};
pub use state::{AppState, app};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
