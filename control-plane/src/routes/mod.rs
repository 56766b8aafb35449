//! HTTP handlers: thin, one file per resource; the logic lives in [`crate::session`].

pub mod meta;
pub mod session;
