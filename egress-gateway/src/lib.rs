//! The egress gateway library; `main.rs` is a thin wrapper so tests can embed the proxy.
