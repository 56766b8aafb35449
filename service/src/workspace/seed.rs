//! Seeding: multipart field → decompress → sanitise → re-tar → the session helper's `extract`
//! (as the sandbox user, over its channel), streamed end to end through bounded channels, so
//! the service holds a few 64 KiB chunks whatever the size.
//!
//! One-shot: a root-owned marker `/.daiv-sandbox/seeded` is written after every archive landed,
//! as a [`ServiceFile`] (its `write-file` exec opened while the archives stream, given its
//! content only at the end). It sits outside `/workspace` (the fs ops cannot reach it) in a directory only
//! root can write (`/` is root-owned and the sandbox runs as `RUN_UID` with no capabilities), so
//! neither the fs ops nor commands can forge or remove it.
//!
//! Failure: when an archive is refused (corrupt, over a limit, a hostile name) part of it may
//! already be extracted. The destinations this request wrote to are then emptied (as the sandbox
//! user, who owns everything extracted) and no marker is written: the session stays unseeded and
//! a corrected retry can succeed.
//!
//! Docker round trips: inspect (session) + one exec (the marker's writer, beside the archives);
//! the marker check and the archives go over the session's helper channel.

use std::io;

use bytes::Bytes;
use futures::Stream;
use multer::Multipart;
use tokio::sync::mpsc;

use super::sanitize::{self, Budget, Options, SanitizeError};
use super::{ChannelReader, ChannelWriter};
use crate::config::Config;
use crate::engine::EngineError;
use crate::layout::{self, SEED_MARKER, WORKSPACE};
use crate::runtime::ServiceFile;
use crate::runtime::{HelperError, SessionRuntime};
use crate::sessions::Workspace;

/// Header carrying how many archive members the sanitiser dropped.
pub const SKIPPED_HEADER: &str = "x-seed-skipped-members";

/// Chunks in flight between the upload, the sanitiser and Docker, per direction.
const CHANNEL_DEPTH: usize = 8;

/// The multipart fields we take and where each lands.
const FIELDS: &[(&str, &str)] = &[
    ("repo_archive", layout::REPO),
    ("skills_archive", layout::SKILLS),
];

/// Why a seed was refused or failed. The texts are what a client is told; the HTTP status of
/// each is decided in [`crate::error`].
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error("Session already seeded: seeding is one-shot per session")]
    AlreadySeeded,
    /// The request's `Content-Type` names no multipart boundary.
    #[error("Invalid `boundary` for `multipart/form-data` request")]
    NotMultipart,
    /// The body went over a bound of [`super::multipart::Guarded`].
    #[error(transparent)]
    BodyBound(#[from] super::multipart::Violation),
    #[error("malformed multipart body: {0}")]
    MalformedMultipart(#[source] multer::Error),
    #[error("at least one of repo_archive or skills_archive is required")]
    NoArchive,
    /// The compressed upload alone is over the seed size limit.
    #[error("archive exceeds the limit of {0} bytes (DAIV_SANDBOX_SEED_MAX_BYTES)")]
    UploadTooLarge(u64),
    #[error("the upload could not be read: {0}")]
    UploadUnreadable(#[source] multer::Error),
    /// The archive (landing in `dest`) is over the size or member budget.
    #[error("{dest}: {source}")]
    OverBudget {
        dest: String,
        #[source]
        source: SanitizeError,
    },
    /// The archive (landing in `dest`) is corrupt or hostile.
    #[error("{dest}: {source}")]
    BadArchive {
        dest: String,
        #[source]
        source: SanitizeError,
    },
    #[error("the session's helper stopped reading the archive")]
    HelperStoppedReading,
    /// The sanitiser's thread panicked or was cancelled.
    #[error("the archive sanitiser did not finish")]
    Sanitiser(#[source] tokio::task::JoinError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Helper(#[from] HelperError),
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SeedOutcome {
    pub members: u64,
    pub skipped: u64,
    /// Decompressed bytes written (the metrics' seed volume).
    pub bytes: u64,
}

/// Seeds the session from a multipart body's archives (its bytes counted in `seed_bytes`): the
/// body as the door received it, with its `Content-Type`. The parser sees it through
/// [`multipart::Guarded`](super::multipart::Guarded), which bounds what it buffers; going over
/// a bound is [`SeedError::BodyBound`], whatever the parser made of the cut stream. The caller
/// holds the session lock and has made sure the session runs.
pub async fn seed<S, E>(
    ws: &Workspace<'_>,
    content_type: Option<&str>,
    body: S,
) -> Result<SeedOutcome, SeedError>
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: Into<super::multipart::BoxError> + 'static,
{
    let boundary = content_type
        .and_then(|ct| multer::parse_boundary(ct).ok())
        .ok_or(SeedError::NotMultipart)?;
    let tripwire = super::multipart::Tripwire::default();
    let guarded = super::multipart::Guarded::new(body, &boundary, tripwire.clone());
    let multipart = Multipart::new(guarded, boundary);
    // The parser only saw a failed stream (and the pipeline, a cut archive): say what it was.
    seed_parts(ws, multipart)
        .await
        .map_err(|e| match tripwire.get() {
            Some(v) => SeedError::BodyBound(v),
            None => e,
        })
}

async fn seed_parts(
    ws: &Workspace<'_>,
    multipart: Multipart<'static>,
) -> Result<SeedOutcome, SeedError> {
    let (engine, runtime, config, id) = (ws.engine, ws.runtime, ws.config, ws.id.as_str());
    let seeded = match runtime.seeded(id).await {
        Ok(seeded) => seeded,
        // A helper from before the `seeded` op (a session created by an older version): ask
        // the engine for the marker.
        Err(e) => {
            tracing::debug!(session_id = %id, error = %e, "seed marker not checked by the helper; asking the engine");
            match engine.get_archive(id, SEED_MARKER).await {
                Ok(_) => true,
                Err(EngineError::NotFound) => false,
                Err(e) => return Err(e.into()),
            }
        }
    };
    if seeded {
        return Err(SeedError::AlreadySeeded);
    }
    // The marker's writer opens while the archives stream (its exec costs as much as a small
    // seed); it writes only when given its content, so a failed seed leaves no marker.
    let file = ServiceFile::root(SEED_MARKER, 0o644);
    let (marker, seeded) = tokio::join!(
        file.open(engine, id),
        seed_fields(runtime, config, id, multipart),
    );
    let (outcome, written) = seeded?;
    let marked = file
        .write(engine, id, &[], &[], marker.ok())
        .await
        .map_err(SeedError::from);
    if let Err(e) = marked {
        cleanup(runtime, id, &written).await;
        return Err(e);
    }
    ws.metrics.workspace.seed_bytes.inc_by(outcome.bytes);
    tracing::info!(
        session_id = %id,
        members = outcome.members,
        skipped = outcome.skipped,
        "session seeded"
    );
    Ok(outcome)
}

/// Every archive field of the request, in order; on failure what was extracted is emptied.
/// Returns the destinations written.
async fn seed_fields(
    runtime: &dyn SessionRuntime,
    config: &Config,
    id: &str,
    mut multipart: Multipart<'static>,
) -> Result<(SeedOutcome, Vec<&'static str>), SeedError> {
    let mut budget = Budget::new(
        config.sessions.seed_max_bytes,
        config.sessions.seed_max_members,
    );
    let mut outcome = SeedOutcome::default();
    let mut written: Vec<&'static str> = Vec::new();
    loop {
        let field = match multipart.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                cleanup(runtime, id, &written).await;
                return Err(SeedError::MalformedMultipart(e));
            }
        };
        let name = field.name().unwrap_or_default().to_string();
        let Some((_, dest)) = FIELDS.iter().find(|(f, _)| *f == name) else {
            continue; // unknown fields are ignored (their bytes are skipped by the parser)
        };
        if written.contains(dest) {
            tracing::warn!(session_id = %id, field = %sanitize::shown(name.as_bytes()), "duplicate seed field ignored");
            continue;
        }
        written.push(dest);
        match seed_one(runtime, config, id, dest, field, &mut budget).await {
            Ok(stats) => {
                outcome.members += stats.members;
                outcome.skipped += stats.skipped;
            }
            Err(e) => {
                cleanup(runtime, id, &written).await;
                return Err(e);
            }
        }
    }
    if written.is_empty() {
        return Err(SeedError::NoArchive);
    }
    outcome.bytes = budget.bytes_used;
    Ok((outcome, written))
}

/// One archive through the pipeline. The upload feeds a bounded channel; a blocking thread
/// decompresses, sanitises and re-tars into another bounded channel, which is `put_archive`'s
/// body. Whichever stage fails first decides the error.
async fn seed_one(
    runtime: &dyn SessionRuntime,
    config: &Config,
    id: &str,
    dest: &str,
    mut field: multer::Field<'static>,
    budget: &mut Budget,
) -> Result<sanitize::Stats, SeedError> {
    let (in_tx, in_rx) = mpsc::channel::<Bytes>(CHANNEL_DEPTH);
    let (out_tx, out_rx) = mpsc::channel::<io::Result<Bytes>>(CHANNEL_DEPTH);
    // Archives are extracted at the workspace: entry names (and the client's messages) are
    // relative to it.
    let name = dest
        .strip_prefix(WORKSPACE)
        .unwrap_or(dest)
        .trim_start_matches('/');
    let opts = Options {
        uid: u64::from(config.sessions.run_uid),
        gid: u64::from(config.sessions.run_gid),
        prefix: name.to_string(),
    };
    let mut worker_budget = *budget;
    let raw_limit = config.sessions.seed_max_bytes;
    let worker = tokio::task::spawn_blocking(move || {
        let mut writer = ChannelWriter::new(out_tx);
        let result = sanitize::sanitize(
            ChannelReader::new(in_rx),
            &mut writer,
            &opts,
            &mut worker_budget,
        );
        match &result {
            Ok(_) => {
                if std::io::Write::flush(&mut writer).is_err() {
                    return (Err(SanitizeError::OutputClosed), worker_budget);
                }
            }
            Err(e) => writer.abort(&e.to_string()),
        }
        (result, worker_budget)
    });
    // The helper extracts as the sandbox user: nothing of the seed is written as root.
    let put = runtime.extract(id, WORKSPACE, out_rx);
    let feed = async move {
        let mut raw: u64 = 0;
        loop {
            match field.chunk().await {
                Ok(Some(chunk)) => {
                    raw += chunk.len() as u64;
                    if raw > raw_limit {
                        return Err(SeedError::UploadTooLarge(raw_limit));
                    }
                    if in_tx.send(chunk).await.is_err() {
                        return Ok(()); // the sanitiser stopped; its result says why
                    }
                }
                Ok(None) => return Ok(()),
                Err(e) => {
                    return Err(SeedError::UploadUnreadable(e));
                }
            }
        }
    };
    let t0 = std::time::Instant::now();
    let feed = async {
        let r = feed.await;
        tracing::debug!(
            elapsed_ms = t0.elapsed().as_secs_f64() * 1e3,
            "seed: upload read"
        );
        r
    };
    let put = async {
        let r = put.await;
        tracing::debug!(
            elapsed_ms = t0.elapsed().as_secs_f64() * 1e3,
            "seed: extracted"
        );
        r
    };
    let worker = async {
        let r = worker.await;
        tracing::debug!(
            elapsed_ms = t0.elapsed().as_secs_f64() * 1e3,
            "seed: sanitised"
        );
        r
    };
    let (fed, put, worked) = tokio::join!(feed, put, worker);
    let (sanitized, used) = worked.map_err(SeedError::Sanitiser)?;
    *budget = used;
    match sanitized {
        Err(SanitizeError::OutputClosed) => {
            fed?;
            put?;
            Err(SeedError::HelperStoppedReading)
        }
        Err(source @ (SanitizeError::TooLarge { .. } | SanitizeError::TooManyMembers { .. })) => {
            Err(SeedError::OverBudget {
                dest: name.to_string(),
                source,
            })
        }
        Err(source) => {
            fed?;
            Err(SeedError::BadArchive {
                dest: name.to_string(),
                source,
            })
        }
        Ok(stats) => {
            fed?;
            put?;
            Ok(stats)
        }
    }
}

/// Empties the destinations a failed seed wrote to, through the helper (as the sandbox user,
/// who owns every extracted entry). Best effort: a failure is logged, the original error is
/// what the client sees.
async fn cleanup(runtime: &dyn SessionRuntime, id: &str, dests: &[&str]) {
    for d in dests {
        if let Err(e) = runtime.clear(id, d).await {
            tracing::warn!(session_id = %id, error = %e, "could not clean up a failed seed");
        }
    }
}
