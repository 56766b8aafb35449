//! What an engine call can fail with, and what of it a client may be told.

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("not found")]
    NotFound,
    #[error("conflict: {0}")]
    Conflict(String),
    /// The image is absent locally and could not be pulled: `failure` says why in our words,
    /// `reason` in the engine's (for the log only).
    #[error("image {image:?} is not available ({failure:?}): {reason}")]
    ImageUnavailable {
        image: String,
        failure: PullFailure,
        reason: String,
    },
    /// The request was refused by the engine (bad parameters): the caller's fault.
    #[error("{0}")]
    Rejected(String),
    /// The engine did not answer or failed: retryable infrastructure trouble.
    #[error("container engine error: {0}")]
    Unavailable(String),
}

/// Why a pull failed, as far as a client may know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullFailure {
    /// The registry refused access (401/403): no credentials, or not valid ones.
    Denied,
    /// Docker Hub's answer for both a missing repository and a private one without access.
    DeniedOrMissing,
    /// The registry does not have the repository, tag or digest.
    Missing,
    InvalidReference,
    /// The registry did not answer (or not as a registry).
    Unreachable,
}

impl PullFailure {
    /// In our words, after "it is not present locally, and".
    pub fn describe(self) -> &'static str {
        match self {
            PullFailure::Denied => "the registry refused access for lack of valid credentials",
            PullFailure::DeniedOrMissing => {
                "the registry does not have it or refused access for lack of valid credentials"
            }
            PullFailure::Missing => "the registry does not have it",
            PullFailure::InvalidReference => "the image reference is not valid",
            PullFailure::Unreachable => "the registry could not be reached",
        }
    }
}

impl EngineError {
    /// What a client may be told. The daemon's own messages stay in the log: they name host
    /// storage paths, registries and internal ids (`Display` keeps them, for the log).
    pub fn public(&self) -> String {
        match self {
            EngineError::NotFound => "not found".to_string(),
            EngineError::Conflict(_) => "the container engine reported a conflict".to_string(),
            EngineError::ImageUnavailable {
                image,
                failure: PullFailure::InvalidReference,
                ..
            } => format!("image {image:?} is not available: the image reference is not valid"),
            EngineError::ImageUnavailable { image, failure, .. } => format!(
                "image {image:?} is not available: it is not present locally, and {}",
                failure.describe()
            ),
            EngineError::Rejected(_) => {
                "the container engine rejected the request's parameters".to_string()
            }
            EngineError::Unavailable(_) => {
                "the container engine is unavailable; retry later".to_string()
            }
        }
    }
}
