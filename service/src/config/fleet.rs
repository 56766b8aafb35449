//! The fleet: the Docker engines sessions are placed on (`ENGINES_FILE`), the file's format, and
//! how many health checks in a row flip an engine (`ENGINE_DOWN_AFTER`, `ENGINE_UP_AFTER`).
//!
//! The file is read at start-up (a bad one stops the service, as any bad setting does) and again
//! whenever it changes (see `crate::fleet`), when a bad one keeps the last good list. Without the
//! setting the service drives the one engine of `DOCKER_HOST` (or the local socket), as always.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::parse::Parser;
// What an endpoint is and its TLS files: leaves, shared with the Docker adapter.
pub use crate::endpoint::{Endpoint, TlsFiles, endpoint_kind};
use crate::ids::is_engine_name;

#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// `ENGINES_FILE`: the engines' list; `None` = the single engine of today.
    pub engines_file: Option<PathBuf>,
    /// The list as read at start-up.
    pub engines: Vec<EngineSpec>,
    /// `ENGINE_DOWN_AFTER`: failed health checks in a row that mark an up engine down. More than
    /// one, so a single slow ping (a busy engine, a GC pause) does not cut every call in flight.
    pub down_after: u32,
    /// `ENGINE_UP_AFTER`: answered health checks in a row that mark a down engine up.
    pub up_after: u32,
}

/// Default of `ENGINE_DOWN_AFTER`: a dead engine is down within about 2 s (5 s when its pings
/// hang rather than fail).
pub const DEFAULT_DOWN_AFTER: u32 = 2;
/// Default of `ENGINE_UP_AFTER`: an engine that answers takes sessions at once.
pub const DEFAULT_UP_AFTER: u32 = 1;
/// Highest either threshold may be (a minute of checks).
const MAX_THRESHOLD: u32 = 60;

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            engines_file: None,
            engines: Vec::new(),
            down_after: DEFAULT_DOWN_AFTER,
            up_after: DEFAULT_UP_AFTER,
        }
    }
}

impl FleetConfig {
    pub(super) fn load(p: &mut Parser<'_>) -> Self {
        let down_after = threshold(p, "ENGINE_DOWN_AFTER", DEFAULT_DOWN_AFTER);
        let up_after = threshold(p, "ENGINE_UP_AFTER", DEFAULT_UP_AFTER);
        let thresholds = Self {
            down_after,
            up_after,
            ..Self::default()
        };
        let Some(raw) = p.get("ENGINES_FILE") else {
            return thresholds;
        };
        let path = PathBuf::from(&raw);
        match read_engines(&path) {
            Ok(engines) => Self {
                engines_file: Some(path),
                engines,
                ..thresholds
            },
            Err(why) => {
                p.fail("ENGINES_FILE", &raw, why);
                thresholds
            }
        }
    }
}

/// A count of health checks in a row, 1 to [`MAX_THRESHOLD`].
fn threshold(p: &mut Parser<'_>, key: &str, default: u32) -> u32 {
    let n = p.parse_or::<u32>(key, default);
    if !(1..=MAX_THRESHOLD).contains(&n) {
        p.fail(
            key,
            &n.to_string(),
            format!("must be 1 to {MAX_THRESHOLD} health checks"),
        );
        return default;
    }
    n
}

/// One engine of the fleet, as the file gives it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSpec {
    /// Prefixes the ids of its sessions and snapshots (unless it is the default engine), is a
    /// metric label and answers in `GET /engines/`.
    pub name: String,
    /// `unix:///path` or `tcp://host:port`.
    pub endpoint: String,
    /// Mutual TLS for a `tcp://` endpoint: the CA that signed the engine's certificate, and the
    /// client certificate and key the engine checks.
    #[serde(default)]
    pub tls: Option<TlsFiles>,
    /// Sessions (warm-pool members included) the engine holds at most; none = no limit.
    #[serde(default)]
    pub max_sessions: Option<u32>,
    /// Memory the engine's sessions may be given in all (their limits summed); none = no limit.
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// No new sessions; the ones it holds keep working.
    #[serde(default)]
    pub drain: bool,
    /// Its sessions' ids carry no engine prefix: the engine a single-engine deployment used, put
    /// in a fleet with the sessions and snapshots it already holds. At most one.
    #[serde(default)]
    pub default: bool,
}

impl EngineSpec {
    /// The prefix of the ids of the engine's sessions and snapshots.
    pub fn prefix(&self) -> Option<&str> {
        (!self.default).then_some(self.name.as_str())
    }

    /// Whether `other` reaches the same engine the same way (only capacity and drain differ).
    pub fn same_link(&self, other: &EngineSpec) -> bool {
        self.name == other.name
            && self.endpoint == other.endpoint
            && self.tls == other.tls
            && self.default == other.default
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnginesFile {
    engines: Vec<EngineSpec>,
}

/// Most engines a file may list.
const MAX_ENGINES: usize = 256;
/// Largest engines file read.
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Reads and checks the engines file; the error says what is wrong in it (never a key's content).
pub fn read_engines(path: &Path) -> Result<Vec<EngineSpec>, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read the file: {e}"))?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!("larger than {MAX_FILE_BYTES} bytes"));
    }
    let text = std::fs::read(path).map_err(|e| format!("cannot read the file: {e}"))?;
    parse_engines(&text)
}

/// Parses and checks an engines file's content.
pub fn parse_engines(text: &[u8]) -> Result<Vec<EngineSpec>, String> {
    // Also here: the fleet reads a changed file whole before parsing it.
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("larger than {MAX_FILE_BYTES} bytes"));
    }
    let file: EnginesFile =
        serde_json::from_slice(text).map_err(|e| format!("not a valid engines file: {e}"))?;
    if file.engines.is_empty() {
        return Err("`engines` lists no engine".to_string());
    }
    if file.engines.len() > MAX_ENGINES {
        return Err(format!("more than {MAX_ENGINES} engines"));
    }
    let mut names = HashSet::new();
    for e in &file.engines {
        let name = &e.name;
        if !is_engine_name(name) {
            return Err(format!(
                "engine name {name:?}: expected 1 to 32 lowercase letters, digits, '-' or '_', starting with a letter or digit"
            ));
        }
        if !names.insert(name.as_str()) {
            return Err(format!("engine name {name:?} is listed twice"));
        }
        match (endpoint_kind(&e.endpoint), &e.tls) {
            (None, _) => {
                return Err(format!(
                    "engine {name:?}: endpoint must be unix:///path or tcp://host:port"
                ));
            }
            (Some(Endpoint::Unix), Some(_)) => {
                return Err(format!("engine {name:?}: tls is for tcp:// endpoints"));
            }
            (Some(Endpoint::Tcp), Some(tls)) => {
                for (what, p) in [("ca", &tls.ca), ("cert", &tls.cert), ("key", &tls.key)] {
                    if !p.is_file() {
                        return Err(format!(
                            "engine {name:?}: tls.{what} {} is not a readable file",
                            p.display()
                        ));
                    }
                }
            }
            _ => {}
        }
        if e.max_sessions == Some(0) {
            return Err(format!(
                "engine {name:?}: max_sessions must be at least 1 (drain it instead)"
            ));
        }
        if e.memory_bytes == Some(0) {
            return Err(format!("engine {name:?}: memory_bytes must be at least 1"));
        }
    }
    if file.engines.iter().filter(|e| e.default).count() > 1 {
        return Err("more than one engine is marked default".to_string());
    }
    Ok(file.engines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Vec<EngineSpec>, String> {
        parse_engines(json.as_bytes())
    }

    #[test]
    fn a_fleet_file_parses_with_defaults() {
        let e = parse(
            r#"{"engines": [{"name": "a", "endpoint": "unix:///var/run/docker.sock", "default": true},
                {"name": "b", "endpoint": "tcp://10.0.0.2:2376", "max_sessions": 200,
                 "memory_bytes": 1000, "drain": true}]}"#,
        )
        .expect("ok");
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].prefix(), None);
        assert_eq!(e[1].prefix(), Some("b"));
        assert_eq!(e[1].max_sessions, Some(200));
        assert!(e[1].drain && !e[0].drain);
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let cases = [
            ("{}", "not a valid engines file"),
            (r#"{"engines": []}"#, "no engine"),
            (
                r#"{"engines": [{"name": "A", "endpoint": "unix:///x"}]}"#,
                "engine name",
            ),
            (
                r#"{"engines": [{"name": "a", "endpoint": "unix:///x"}, {"name": "a", "endpoint": "unix:///y"}]}"#,
                "listed twice",
            ),
            (
                r#"{"engines": [{"name": "a", "endpoint": "http://x:1"}]}"#,
                "endpoint must be",
            ),
            (
                r#"{"engines": [{"name": "a", "endpoint": "tcp://x"}]}"#,
                "endpoint must be",
            ),
            (
                r#"{"engines": [{"name": "a", "endpoint": "unix:///x", "tls": {"ca": "/", "cert": "/", "key": "/"}}]}"#,
                "tls is for tcp",
            ),
            (
                r#"{"engines": [{"name": "a", "endpoint": "tcp://x:1", "tls": {"ca": "/nonexistent", "cert": "/", "key": "/"}}]}"#,
                "tls.ca",
            ),
            (
                r#"{"engines": [{"name": "a", "endpoint": "unix:///x", "max_sessions": 0}]}"#,
                "max_sessions",
            ),
            (
                r#"{"engines": [{"name": "a", "endpoint": "unix:///x", "default": true}, {"name": "b", "endpoint": "unix:///y", "default": true}]}"#,
                "more than one",
            ),
            (
                r#"{"engines": [{"name": "a", "endpoint": "unix:///x", "typo": 1}]}"#,
                "unknown field",
            ),
        ];
        for (json, want) in cases {
            let err = parse(json).expect_err("an error");
            assert!(err.contains(want), "{json}: {err}");
        }
    }

    #[test]
    fn health_thresholds_default_and_are_checked() {
        let c = crate::config::for_tests("k", &[]);
        assert_eq!((c.fleet.down_after, c.fleet.up_after), (2, 1));
        let c =
            crate::config::for_tests("k", &[("ENGINE_DOWN_AFTER", "3"), ("ENGINE_UP_AFTER", "2")]);
        assert_eq!((c.fleet.down_after, c.fleet.up_after), (3, 2));
        for (key, raw) in [
            ("ENGINE_DOWN_AFTER", "0"),
            ("ENGINE_UP_AFTER", "61"),
            ("ENGINE_UP_AFTER", "x"),
        ] {
            let env = std::collections::HashMap::from([
                ("API_KEY".to_string(), "k".to_string()),
                (key.to_string(), raw.to_string()),
            ]);
            let err = crate::config::load(&env).expect_err("refused").to_string();
            assert!(err.contains(key), "{err}");
        }
    }
}
