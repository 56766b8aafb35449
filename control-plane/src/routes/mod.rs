//! HTTP handlers: thin, one file per resource; the logic lives in [`crate::session`].

pub mod docs;
pub mod egress;
pub mod fs;
pub mod meta;
pub mod metrics;
pub mod processes;
pub mod seed;
pub mod session;
