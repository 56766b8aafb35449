//! The leaves of daiv-sandbox that the control plane and its engine crate (`sandbox-engine`)
//! both need. They import nothing of either; the control plane re-exports each at its crate root
//! (`crate::ids`, `crate::secret`, ...), where its layering table counts them as leaves.
//!
//! - [`ids`]: the ids the service makes or checks (session, snapshot and engine names, tokens).
//! - [`secret`]: a value that must never be printed.
//! - [`time`]: Unix time as labels, records and logs write it.
//! - [`archive`]: the one builder of the tar archives the service makes itself.
//! - [`shared_file`]: a file sent into many archives without being held in memory.
//! - [`endpoint`]: what an engine endpoint is (`unix://` or `tcp://`), and its TLS files.

pub mod archive;
pub mod endpoint;
pub mod ids;
pub mod secret;
pub mod shared_file;
pub mod time;
