//! [`MeteredEngine`]: every container-engine call counted and timed, by the engine crate's
//! decorator (`sandbox_engine::metered`) into its metric group, which [`super::metrics::Metrics`]
//! holds and registers.

pub use crate::engine::metered::{DEFAULT_ENGINE, MeteredEngine, kind};
