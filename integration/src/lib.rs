//! What the gateway's tests and benchmark run against: fixture upstream servers on loopback
//! (HTTP and HTTPS with a test CA made at start), and the benchmark driver (`src/bin`).
//!
//! # Layout
//! - [`fixtures`]: `TestCa`, `start_upstream`, RSS probes.
//! - `src/bin/gateway-bench.rs`: the egress gateway benchmark (table + JSON).
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod fixtures;
