//! A value that must never be printed.

use std::fmt;

/// API keys, Redis URLs with passwords, upstream proxy credentials: `Debug` shows `***`, and the
/// value is only reachable through [`Secret::expose`], where it is used.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}
