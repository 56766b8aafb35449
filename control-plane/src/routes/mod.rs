//! HTTP handlers: thin, one file per resource. Each parses its request, takes the session's lock
//! where the operation needs one, calls the domain ([`crate::session`], [`crate::processes`],
//! [`crate::workspace`], [`crate::egress`]) and answers; a failure's status and body come from
//! [`crate::error`], never from here. [`admit`] holds the admission layers the create, seed and
//! fs routes sit behind.

pub mod admit;
pub mod docs;
pub mod egress;
pub mod fs;
pub mod meta;
pub mod metrics;
pub mod observe;
pub mod processes;
pub mod seed;
pub mod session;
