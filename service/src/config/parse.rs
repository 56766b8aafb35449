//! Where raw values come from ([`Source`]: the environment, then `/run/secrets`) and how they
//! become typed settings ([`Parser`]): the readers for strings, numbers, booleans, choices,
//! seconds and rates, each recording a bad value instead of stopping at it. Every group of
//! settings reads through the same [`Parser`], so one run collects the problems of all of them.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use super::{ConfigError, PREFIX};

/// Where a setting's raw value comes from. Tests use a `HashMap`; the binary uses [`ProcessEnv`].
pub trait Source {
    /// The raw value of `DAIV_SANDBOX_{key}`, `None` when unset or empty.
    fn get(&self, key: &str) -> Option<String>;
}

/// The process environment, then files in a secrets directory (default `/run/secrets`).
pub struct ProcessEnv {
    secrets_dir: PathBuf,
}

impl ProcessEnv {
    pub fn new() -> Self {
        Self::with_secrets_dir("/run/secrets")
    }

    pub fn with_secrets_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            secrets_dir: dir.into(),
        }
    }

    fn secret_file(&self, name: &str) -> Option<String> {
        // The reference reads `/run/secrets/<prefix><field>` case-insensitively; accept both the
        // upper-case spelling and the lower-case one Docker users tend to pick.
        [name.to_string(), name.to_ascii_lowercase()]
            .iter()
            .map(|n| self.secrets_dir.join(n))
            .find_map(|p| std::fs::read_to_string(p).ok())
            .map(|v| v.trim_end_matches(['\n', '\r']).to_string())
    }
}

impl Default for ProcessEnv {
    fn default() -> Self {
        Self::new()
    }
}

impl Source for ProcessEnv {
    fn get(&self, key: &str) -> Option<String> {
        let name = format!("{PREFIX}{key}");
        std::env::var(&name)
            .ok()
            .or_else(|| self.secret_file(&name))
            .filter(|v| !v.is_empty())
    }
}

impl Source for HashMap<String, String> {
    fn get(&self, key: &str) -> Option<String> {
        HashMap::get(self, key).filter(|v| !v.is_empty()).cloned()
    }
}

/// Collects problems instead of stopping at the first.
pub(super) struct Parser<'a> {
    src: &'a dyn Source,
    /// One line per problem, naming its variable; the groups' `load`s also push lines of their
    /// own.
    pub(super) errors: Vec<String>,
}

impl<'a> Parser<'a> {
    pub(super) fn new(src: &'a dyn Source) -> Self {
        Self {
            src,
            errors: Vec::new(),
        }
    }

    /// The raw value, for settings no typed reader fits (optional strings, pairs, lists).
    pub(super) fn get(&self, key: &str) -> Option<String> {
        self.src.get(key)
    }

    pub(super) fn fail(&mut self, key: &str, raw: &str, why: impl fmt::Display) {
        self.errors.push(format!("{PREFIX}{key}={raw:?}: {why}"));
    }

    pub(super) fn string_or(&mut self, key: &str, default: &str) -> String {
        self.src.get(key).unwrap_or_else(|| default.to_string())
    }

    pub(super) fn parse_or<T>(&mut self, key: &str, default: T) -> T
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        self.parse_opt(key).unwrap_or(default)
    }

    fn parse_opt<T>(&mut self, key: &str) -> Option<T>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        let raw = self.src.get(key)?;
        match raw.trim().parse::<T>() {
            Ok(v) => Some(v),
            Err(e) => {
                self.fail(key, &raw, e);
                None
            }
        }
    }

    /// Pydantic's bool spellings, so existing deployments keep working.
    pub(super) fn bool_or(&mut self, key: &str, default: bool) -> bool {
        let Some(raw) = self.src.get(key) else {
            return default;
        };
        match raw.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "t" | "yes" | "y" | "on" => true,
            "0" | "false" | "f" | "no" | "n" | "off" => false,
            _ => {
                self.fail(key, &raw, "expected a boolean (true/false)");
                default
            }
        }
    }

    pub(super) fn choice<T: Copy>(&mut self, key: &str, default: T, options: &[(&str, T)]) -> T {
        let Some(raw) = self.src.get(key) else {
            return default;
        };
        match options.iter().find(|(name, _)| *name == raw.trim()) {
            Some((_, v)) => *v,
            None => {
                let names: Vec<_> = options.iter().map(|(n, _)| *n).collect();
                self.fail(key, &raw, format!("expected one of {}", names.join(", ")));
                default
            }
        }
    }

    pub(super) fn seconds_or(&mut self, key: &str, default: u64) -> Duration {
        Duration::from_secs(self.parse_or::<u64>(key, default))
    }

    /// Float seconds (the lock wait and refresh take fractions); must be finite and positive.
    pub(super) fn float_seconds_or(&mut self, key: &str, default: f64) -> Duration {
        let Some(raw) = self.src.get(key) else {
            return Duration::from_secs_f64(default);
        };
        match raw.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v > 0.0 && v < 1e9 => Duration::from_secs_f64(v),
            Ok(_) => {
                self.fail(key, &raw, "expected a positive number of seconds");
                Duration::from_secs_f64(default)
            }
            Err(e) => {
                self.fail(key, &raw, e);
                Duration::from_secs_f64(default)
            }
        }
    }

    pub(super) fn positive_f64_opt(&mut self, key: &str) -> Option<f64> {
        let raw = self.src.get(key)?;
        match raw.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v > 0.0 => Some(v),
            _ => {
                self.fail(key, &raw, "expected a positive number");
                None
            }
        }
    }

    pub(super) fn rate_or(&mut self, key: &str, default: f64) -> f64 {
        let Some(raw) = self.src.get(key) else {
            return default;
        };
        match raw.trim().parse::<f64>() {
            Ok(v) if (0.0..=1.0).contains(&v) => v,
            _ => {
                self.fail(key, &raw, "expected a number between 0.0 and 1.0");
                default
            }
        }
    }

    pub(super) fn finish(self) -> Result<(), ConfigError> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigError(self.errors))
        }
    }
}
