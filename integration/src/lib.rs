//! What the gateway's tests and benchmark run against: fixture upstream servers on loopback
//! (HTTP and HTTPS with a test CA made at start), and the benchmark driver (`src/bin`).
//!
//! # Layout
//! - [`fixtures`]: `TestCa`, `start_upstream`, RSS probes.
//! - [`cp`]: a client of the control plane's API and the archives the drivers seed with.
//! - `src/bin/cp-bench.rs`: the control plane benchmark (latency per operation).
//! - `src/bin/cp-soak.rs`: the control plane soak (N busy sessions for a set time).
//! - `src/bin/gateway-bench.rs`: the egress gateway benchmark (table + JSON).
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod cp;
pub mod fixtures;
pub mod report;
