//! What is wrong with a request's values, found before anything is asked of an engine: the
//! 422s (and the 400 of egress where none is configured) of a create, a run, a fork or a
//! timeout. Defined here, the lowest layer that checks a request (a create's image and limits);
//! the sessions above raise the rest. The texts are what a client is told.

use super::{MAX_TIMEOUT_SECS, MIN_MEMORY_BYTES};
use crate::api::StartSessionRequest;
use crate::engine::reference;

#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    /// Egress was asked for, but this instance has no egress CA. The text is the reference's:
    /// DAIV looks for "egress proxy" in it to tell its operator what to configure.
    #[error("egress requires the egress proxy, which is not configured on this deployment")]
    EgressNotConfigured,
    #[error("base_image is not a valid image reference: {0:?}")]
    InvalidImage(String),
    #[error(
        "base_image must be a repository reference (name[:tag] or name@digest), not an image id"
    )]
    ImageById,
    /// A snapshot's image given as `base_image` (by its tag or under another name).
    #[error("base_image names a snapshot's image: create from a snapshot with snapshot_id")]
    SnapshotAsImage,
    /// `base_image` and `snapshot_id` name different images.
    #[error("base_image does not match the snapshot's base image {0:?}")]
    SnapshotImageMismatch(String),
    #[error("memory_bytes must be at least {MIN_MEMORY_BYTES} (6 MiB)")]
    MemoryTooSmall,
    #[error("cpus must be a number between 0.01 and 1024")]
    InvalidCpus,
    /// A caller's environment that breaks [`crate::api::Environment`]'s rule (an MCP tool's
    /// arguments; a request's body is checked as it is read).
    #[error(transparent)]
    InvalidEnvironment(#[from] crate::api::InvalidEnvironment),
    /// The command, shortened and with its NULs shown as `\0`.
    #[error("command contains a NUL byte: {0:?}")]
    NulInCommand(String),
    /// A command's timeout past [`MAX_TIMEOUT_SECS`].
    #[error("timeout must be at most {MAX_TIMEOUT_SECS} seconds (0 = none)")]
    TimeoutTooLong,
    /// A session's lifetime out of range.
    #[error(
        "timeout_seconds must be between 1 and {} (30 days)",
        crate::api::MAX_SESSION_TIMEOUT_SECS
    )]
    SessionTimeout,
    /// Metadata that breaks [`crate::api::Metadata`]'s rule once a patch is applied.
    #[error("{0}")]
    InvalidMetadata(String),
    /// A fork's count outside 1 to `FORK_MAX_COUNT` (the cap).
    #[error("count must be between 1 and {0}")]
    ForkCount(u32),
}

/// A create request's own values: its image reference and limits. (The environment was checked
/// as it was read, `api::Environment`; the egress policy is the egress layer's.)
pub(super) fn validate_start(req: &StartSessionRequest) -> Result<(), ValidationError> {
    let image = req.base_image.trim();
    if image.is_empty()
        || image.len() > 512
        || image.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(ValidationError::InvalidImage(req.base_image.clone()));
    }
    if reference::is_image_id(image) {
        return Err(ValidationError::ImageById);
    }
    if reference::repository(image) == crate::snapshots::IMAGE_REPOSITORY {
        return Err(ValidationError::SnapshotAsImage);
    }
    if let Some(m) = req.memory_bytes
        && m < MIN_MEMORY_BYTES
    {
        return Err(ValidationError::MemoryTooSmall);
    }
    // Docker takes nano-CPUs: anything that rounds to 0 would mean "unlimited".
    if let Some(c) = req.cpus
        && !(c.is_finite() && (0.01..=1024.0).contains(&c))
    {
        return Err(ValidationError::InvalidCpus);
    }
    Ok(())
}
