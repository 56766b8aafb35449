//! What every session gets: its container runtime, user, network and helper, the timeouts of its
//! commands, and the limits that keep the service's memory independent of what sandboxes do.

use std::path::PathBuf;
use std::time::Duration;

use super::parse::Parser;

/// Directory basenames pruned from `fs/glob` and `fs/grep` unless `FS_PRUNE_DIRS` replaces the
/// list: caches, VCS metadata and build output. Dependency sources (`node_modules`, `.venv`,
/// `vendor`) stay searchable on purpose: agents read dependency code.
pub const DEFAULT_PRUNE_DIRS: &[&str] = &[
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".tox",
    ".nox",
    ".cache",
    ".gradle",
    ".next",
    ".nuxt",
    ".parcel-cache",
    ".turbo",
    ".terraform",
    "target",
    "obj",
    "build",
    "dist",
    "coverage",
    "htmlcov",
    "*.egg-info",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    Runc,
    Runsc,
}

impl Runtime {
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Runc => "runc",
            Runtime::Runsc => "runsc",
        }
    }
}

/// The choices of `RUNTIME` and `EGRESS_PROXY_RUNTIME`.
pub(super) const RUNTIMES: &[(&str, Runtime)] =
    &[("runc", Runtime::Runc), ("runsc", Runtime::Runsc)];

/// The helper's own uid unless `HELPER_UID` says otherwise: free in the images we know of,
/// and any other uid than the sandbox user's works (nothing in the sandbox can become it).
pub const DEFAULT_HELPER_UID: u32 = 65533;

#[derive(Debug, Clone)]
pub struct SessionsConfig {
    pub runtime: Runtime,
    /// The image the start-up probe of `runsc` runs `ls` and `stat` in
    /// (`RUNTIME_PROBE_IMAGE`); unset = the first warm-pool image (see
    /// `telemetry::runtime_probe`).
    pub runtime_probe_image: Option<String>,
    pub run_uid: u32,
    pub run_gid: u32,
    /// `RUN_UID_RANGE` (`FIRST-LAST`, inclusive): each new sandbox's commands run as a uid of
    /// this range that no other sandbox on its engine has, instead of `RUN_UID`. Under runc
    /// every sandbox of one uid shares that uid's kernel limits (inotify instances and watches,
    /// processes, POSIX message queue bytes) host-wide; a uid of its own gives each session its
    /// own. `None`: every sandbox runs as `RUN_UID`.
    pub run_uid_range: Option<(u32, u32)>,
    /// The uid (and gid) the in-sandbox helper takes for itself (`HELPER_UID`): one commands do
    /// not share, so they cannot signal, trace or impersonate it.
    pub helper_uid: u32,
    pub network: Option<String>,
    /// The static `daiv-sandbox-helper` binary given to every sandbox (`HELPER_BIN`); unset =
    /// found beside the service's executable (see `runtime::helper_binary`).
    pub helper_bin: Option<PathBuf>,
    /// `None` means no default timeout (`COMMAND_TIMEOUT=0`).
    pub command_timeout: Option<Duration>,
    pub stop_timeout: Duration,
    pub fs_prune_dirs: Vec<String>,
    /// Largest `fs/ls` or `fs/glob` answer, in bytes of its entries' JSON (`FS_LIST_MAX_BYTES`);
    /// a larger one is `too_large`. The answer streams: this bounds what a client receives, not
    /// the service's memory.
    pub fs_list_max_bytes: u64,
    // Beyond the reference: limits that keep the service's memory independent of what sandboxes do.
    /// Bytes of output kept per command; the rest is counted and replaced by a marker.
    pub output_max_bytes: usize,
    /// Bytes of output kept per run request, all its commands together (the rest counted too).
    pub run_output_max_bytes: usize,
    /// Process limit per sandbox container (fork bombs stay inside their session).
    pub pids_limit: i64,
    /// Upper bound on the decompressed bytes of one seed archive.
    pub seed_max_bytes: u64,
    /// Upper bound on the number of members of one seed archive.
    pub seed_max_members: u64,
    /// Largest raw file a `PUT /session/{id}/files` takes (`FILE_MAX_BYTES`).
    pub file_max_bytes: u64,
    /// Output bytes kept per background process (oldest dropped past it).
    pub process_output_bytes: u64,
    /// Live background processes allowed per session.
    pub max_processes: u32,
    /// Longest a process poll may wait for new output (`wait` is capped to it).
    pub process_wait_max: Duration,
    /// Most silence on a streaming run before a heartbeat line.
    pub stream_heartbeat: Duration,
    /// How often each running session's CPU, memory and disk are sampled
    /// (`SESSION_METRICS_INTERVAL_SECONDS`; `None`: never, `GET .../metrics/` then answers one
    /// sample taken as it is asked).
    pub metrics_interval: Option<Duration>,
    /// Samples kept per session (`SESSION_METRICS_SAMPLES`): the window is this many intervals.
    pub metrics_samples: usize,
}

impl SessionsConfig {
    pub(super) fn load(p: &mut Parser<'_>) -> Self {
        let runtime = p.choice("RUNTIME", Runtime::Runc, RUNTIMES);
        let run_uid = p.parse_or::<u32>("RUN_UID", 1000);
        let run_gid = p.parse_or::<u32>("RUN_GID", 1000);
        if run_uid == 0 {
            p.fail("RUN_UID", "0", "commands never run as root");
        }
        let helper_uid = p.parse_or::<u32>("HELPER_UID", DEFAULT_HELPER_UID);
        if helper_uid == 0 || helper_uid == run_uid {
            let raw = helper_uid.to_string();
            p.fail(
                "HELPER_UID",
                &raw,
                "must be neither 0 nor RUN_UID: commands must not share the helper's uid",
            );
        }
        let run_uid_range = p.get("RUN_UID_RANGE").filter(|r| !r.trim().is_empty());
        let run_uid_range = run_uid_range.and_then(|raw| {
            let range = raw.trim().split_once('-').and_then(|(a, b)| {
                Some((a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?))
            });
            let why = match range {
                None => Some("expected FIRST-LAST, two uids (for example 200000-265535)"),
                Some((first, last)) if first == 0 || last < first => {
                    Some("FIRST must be at least 1 and LAST at least FIRST")
                }
                Some((first, last)) if (first..=last).contains(&helper_uid) => {
                    Some("must not contain HELPER_UID: commands must not share the helper's uid")
                }
                Some(_) => None,
            };
            if let Some(why) = why {
                p.fail("RUN_UID_RANGE", &raw, why);
                return None;
            }
            range
        });
        let network = p.get("NETWORK");
        let runtime_probe_image = p
            .get("RUNTIME_PROBE_IMAGE")
            .filter(|i| !i.trim().is_empty());

        let fs_prune_dirs: Vec<String> = match p.get("FS_PRUNE_DIRS") {
            Some(raw) => raw
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            None => DEFAULT_PRUNE_DIRS.iter().map(|s| s.to_string()).collect(),
        };
        for dir in &fs_prune_dirs {
            if dir.contains('/') || dir.contains('\0') || dir.contains('\n') {
                let raw = dir.clone();
                p.fail(
                    "FS_PRUNE_DIRS",
                    &raw,
                    "entries are directory basenames or globs, without '/'",
                );
            }
        }

        let fs_list_max_bytes = p.parse_or::<u64>("FS_LIST_MAX_BYTES", 64 * 1024 * 1024);
        if fs_list_max_bytes == 0 {
            p.fail("FS_LIST_MAX_BYTES", "0", "must be at least 1");
        }

        let command_timeout = Some(p.seconds_or("COMMAND_TIMEOUT", 0)).filter(|d| !d.is_zero());
        let stop_timeout = p.seconds_or("STOP_TIMEOUT_SECONDS", 2);
        let helper_bin = p.get("HELPER_BIN").map(PathBuf::from);

        let output_max_bytes = p.parse_or::<usize>("OUTPUT_MAX_BYTES", 16 * 1024 * 1024);
        if output_max_bytes == 0 {
            p.fail("OUTPUT_MAX_BYTES", "0", "must be at least 1");
        }
        let run_output_max_bytes = p.parse_or::<usize>("RUN_OUTPUT_MAX_BYTES", 32 * 1024 * 1024);
        if run_output_max_bytes == 0 {
            p.fail("RUN_OUTPUT_MAX_BYTES", "0", "must be at least 1");
        }
        let pids_limit = p.parse_or::<i64>("PIDS_LIMIT", 4096);
        if pids_limit < 1 {
            let raw = pids_limit.to_string();
            p.fail("PIDS_LIMIT", &raw, "must be at least 1");
        }
        let seed_max_bytes = p.parse_or::<u64>("SEED_MAX_BYTES", 2 * 1024 * 1024 * 1024);
        let seed_max_members = p.parse_or::<u64>("SEED_MAX_MEMBERS", 200_000);
        let file_max_bytes = p.parse_or::<u64>("FILE_MAX_BYTES", 1024 * 1024 * 1024);
        let process_output_bytes = p.parse_or::<u64>("PROCESS_OUTPUT_BYTES", 1024 * 1024);
        if !(1..=8 * 1024 * 1024).contains(&process_output_bytes) {
            let raw = process_output_bytes.to_string();
            p.fail(
                "PROCESS_OUTPUT_BYTES",
                &raw,
                "must be between 1 and 8388608 (8 MiB)",
            );
        }
        let max_processes = p.parse_or::<u32>("MAX_PROCESSES", 16);
        if max_processes == 0 {
            p.fail("MAX_PROCESSES", "0", "must be at least 1");
        }
        let process_wait_max = p.parse_or::<u64>("PROCESS_WAIT_MAX_SECONDS", 30);
        if process_wait_max > 300 {
            let raw = process_wait_max.to_string();
            p.fail("PROCESS_WAIT_MAX_SECONDS", &raw, "must be at most 300");
        }
        let stream_heartbeat = p.parse_or::<u64>("STREAM_HEARTBEAT_SECONDS", 10);
        if !(1..=10).contains(&stream_heartbeat) {
            let raw = stream_heartbeat.to_string();
            p.fail("STREAM_HEARTBEAT_SECONDS", &raw, "must be between 1 and 10");
        }
        let metrics_interval = p.parse_or::<u64>("SESSION_METRICS_INTERVAL_SECONDS", 5);
        if metrics_interval > 3600 {
            let raw = metrics_interval.to_string();
            p.fail(
                "SESSION_METRICS_INTERVAL_SECONDS",
                &raw,
                "must be at most 3600 (0: off)",
            );
        }
        let metrics_samples = p.parse_or::<usize>("SESSION_METRICS_SAMPLES", 120);
        if !(1..=10_000).contains(&metrics_samples) {
            let raw = metrics_samples.to_string();
            p.fail(
                "SESSION_METRICS_SAMPLES",
                &raw,
                "must be between 1 and 10000",
            );
        }

        Self {
            runtime,
            runtime_probe_image,
            run_uid,
            run_gid,
            run_uid_range,
            helper_uid,
            network,
            helper_bin,
            command_timeout,
            stop_timeout,
            fs_prune_dirs,
            fs_list_max_bytes,
            output_max_bytes,
            run_output_max_bytes,
            pids_limit,
            seed_max_bytes,
            seed_max_members,
            file_max_bytes,
            process_output_bytes,
            max_processes,
            process_wait_max: Duration::from_secs(process_wait_max),
            stream_heartbeat: Duration::from_secs(stream_heartbeat),
            metrics_interval: (metrics_interval > 0).then(|| Duration::from_secs(metrics_interval)),
            metrics_samples,
        }
    }
}
