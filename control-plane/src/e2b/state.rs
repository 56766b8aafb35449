//! What every E2B handler reaches, and the envd version it answers as: below the handlers, so
//! they import it and `mod.rs` alone composes them.

use std::sync::Arc;

use crate::config::Config;

/// The envd version this service answers as: the highest whose features are all served (file
/// metadata, envd 0.6.2, is not), so the SDK itself refuses what is not.
pub const ENVD_VERSION: &str = "0.6.1";

/// What every handler reaches.
#[derive(Clone)]
pub struct E2b {
    pub config: Arc<Config>,
    pub native: super::native::Native,
    pub tokens: super::token::Tokens,
    pub watchers: Arc<super::polled::Watchers>,
}
