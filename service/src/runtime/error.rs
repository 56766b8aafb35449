//! Why an operation through the session's helper did not complete. The HTTP status of each is
//! decided in [`crate::error`]; the texts are what a client is told (never the helper's own
//! failure details, which are logged where they are seen).

use super::FS_DEADLINE;
use super::channel::ChannelError;
use crate::engine::EngineError;

#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// The exec that would open the helper's channel failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The helper's channel opened but the helper never spoke its protocol.
    #[error("the session's helper could not be started; retry, or recreate the session")]
    Unstartable(#[source] ChannelError),
    /// The helper speaks another protocol version and this build's helper could not be put
    /// beside it.
    #[error(
        "the session's helper speaks another protocol version than this service; recreate the session"
    )]
    OtherProtocol(#[source] ChannelError),
    /// The channel closed during the operation (the helper or its container went away).
    #[error("the session's helper went away during the operation; retry")]
    Lost,
    /// The channel broke in another way than closing.
    #[error(transparent)]
    Channel(ChannelError),
    /// The helper refused the request as malformed.
    #[error("{0}")]
    Rejected(String),
    /// The helper stopped the op at its server-side deadline.
    #[error("the operation took longer than {}s and was stopped", FS_DEADLINE.as_secs())]
    DeadlineExceeded,
    /// The helper failed in a way of its own (logged with its message where it was seen).
    #[error("the session's helper failed; retry")]
    Failed,
    /// No answer well past the helper's own deadline.
    #[error("the session's helper did not answer in time; retry")]
    NoAnswer,
    /// The session's helper broke the protocol a moment ago: no new channel for a while.
    #[error(
        "the session's helper misbehaved and is not trusted for a while; retry later, or recreate the session"
    )]
    Untrusted,
    /// An answer that does not have the op's shape.
    #[error("the session's helper gave an unexpected answer; retry")]
    UnexpectedAnswer,
    /// The archive producer failed (its own error is what the caller reports).
    #[error("the archive was refused")]
    ArchiveRefused,
    /// The process supervisor knows no such process.
    #[error("no such process")]
    NoSuchProcess,
    /// The supervisor refused the request in the process's state (stdin closed, ended, ...).
    #[error("{0}")]
    ProcessConflict(String),
    /// The session's limit of live background processes is reached.
    #[error("{0}")]
    ProcessLimit(String),
    /// The supervisor could not do what was asked (the working directory is missing, ...).
    #[error("{0}")]
    ProcessIo(String),
    /// The process's events asked for have left its bounded buffer.
    #[error("{0}")]
    ProcessGone(String),
    /// Nothing in the sandbox listens on the port a connection was asked for.
    #[error("nothing in the sandbox listens on port {0}")]
    PortClosed(u16),
}
