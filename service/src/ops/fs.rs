//! The data plane's operations on paths anywhere (`stat`, `mkdir`, `move`, `list`, and E2B's
//! removal of a tree): each takes
//! one of the session's fs slots and one of the total (its request is a path or two, read before
//! the slot), the writers the session's lock too. An fs-level problem is inside the answer
//! (`error`), as the `fs/*` ops answer theirs.

use sandbox_protocol::files::{
    FsListRequest, FsListResponse, FsMkdirRequest, FsMkdirResponse, FsMoveRequest, FsMoveResponse,
    FsStatRequest, FsStatResponse,
};
use sandbox_protocol::wire::{
    FsDeleteRequest, FsDeleteResponse, FsEditRequest, FsEditResponse, FsError, FsErrorCode,
    FsGlobRequest, FsGrepRequest, FsGrepResponse, FsLsRequest, FsReadRequest, FsReadResponse,
    FsWriteRequest, FsWriteResponse,
};

use super::{Access, Admit, Hold, Op, Reached};
use crate::api::RunRequest;
use crate::error::ApiError;
pub use crate::workspace::fs::Entries;
use crate::workspace::fs::{Fs, OpError, respond};

/// An agent's file tool's answer (the reference's `fs/*` routes, MCP's file tools): the answer
/// or its fs-level refusal, with the fs slot (and a writer's lock) kept until the door has sent
/// it.
pub struct Tooled<T> {
    pub answer: Result<T, FsError>,
    pub hold: Hold,
}

fn tooled<T>(r: Result<T, OpError>, at: Reached) -> Result<Tooled<T>, ApiError> {
    let answer = match r {
        Ok(v) => Ok(v),
        Err(OpError::Fs(e)) => Err(e),
        Err(OpError::Failed(e)) => return Err(e.into()),
    };
    Ok(Tooled {
        answer,
        hold: at.into_hold(),
    })
}

/// The agent's file tools, each an fs slot: the readers beside the session's work, the writers
/// in its order (its lock). `ls` and `glob` answer their entries as they stream from the
/// session.
macro_rules! tool_op {
    ($(#[$doc:meta])* $name:ident, $method:ident, $req:ty, $out:ty, $access:ident) => {
        $(#[$doc])*
        pub struct $name(pub $req);

        impl Op for $name {
            type Output = Tooled<$out>;
            const ADMIT: Admit = Admit::Fs;
            const ACCESS: Access = Access::$access;

            async fn apply(self, at: Reached) -> Result<Tooled<$out>, ApiError> {
                let r = Fs::new(&at.workspace()).$method(&self.0).await;
                tooled(r, at)
            }
        }
    };
}

tool_op!(
    /// A directory's entries.
    Ls, ls_entries, FsLsRequest, Entries, Beside
);
tool_op!(
    /// The paths a pattern matches.
    Glob, glob_entries, FsGlobRequest, Entries, Beside
);
tool_op!(
    /// A text file's lines.
    Read, read, FsReadRequest, FsReadResponse, Beside
);
tool_op!(
    /// The lines a pattern matches.
    Grep, grep, FsGrepRequest, FsGrepResponse, Beside
);
tool_op!(
    /// A file written whole.
    Write, write, FsWriteRequest, FsWriteResponse, Ordered
);
tool_op!(
    /// A file's text replaced.
    Edit, edit, FsEditRequest, FsEditResponse, Ordered
);
tool_op!(
    /// A file or an empty directory deleted.
    Delete, delete, FsDeleteRequest, FsDeleteResponse, Ordered
);

/// A path's entry.
pub struct Stat(pub FsStatRequest);

impl Op for Stat {
    type Output = FsStatResponse;
    const ADMIT: Admit = Admit::Fs;
    const ACCESS: Access = Access::Beside;

    async fn apply(self, at: Reached) -> Result<FsStatResponse, ApiError> {
        let r = Fs::new(&at.workspace()).stat(&self.0).await;
        Ok(respond(r, |v: &mut FsStatResponse, e| v.error = Some(e))?)
    }
}

/// A directory made.
pub struct Mkdir(pub FsMkdirRequest);

impl Op for Mkdir {
    type Output = FsMkdirResponse;
    const ADMIT: Admit = Admit::Fs;
    const ACCESS: Access = Access::Ordered;

    async fn apply(self, at: Reached) -> Result<FsMkdirResponse, ApiError> {
        let r = Fs::new(&at.workspace()).mkdir(&self.0).await;
        Ok(respond(r, |v: &mut FsMkdirResponse, e| v.error = Some(e))?)
    }
}

/// An entry renamed.
pub struct Move(pub FsMoveRequest);

impl Op for Move {
    type Output = FsMoveResponse;
    const ADMIT: Admit = Admit::Fs;
    const ACCESS: Access = Access::Ordered;

    async fn apply(self, at: Reached) -> Result<FsMoveResponse, ApiError> {
        let r = Fs::new(&at.workspace()).move_entry(&self.0).await;
        Ok(respond(r, |v: &mut FsMoveResponse, e| v.error = Some(e))?)
    }
}

/// A directory's entries, some levels down.
pub struct List(pub FsListRequest);

impl Op for List {
    type Output = FsListResponse;
    const ADMIT: Admit = Admit::Fs;
    const ACCESS: Access = Access::Beside;

    async fn apply(self, at: Reached) -> Result<FsListResponse, ApiError> {
        let r = Fs::new(&at.workspace()).list(&self.0).await;
        Ok(respond(r, |v: &mut FsListResponse, e| v.error = Some(e))?)
    }
}

/// Removes a path and everything below it, anywhere the sandbox user may (E2B's `Remove`; no
/// fs op removes a tree outside `/workspace`): a `stat`, then `rm -rf` run as the user, both
/// under the session's lock.
pub struct RemoveTree {
    pub path: String,
}

/// What a [`RemoveTree`] did.
#[derive(Debug)]
pub enum Removal {
    Removed,
    /// Nothing was there: removed already.
    Absent,
    /// The `stat` refused the path (not a path, not the user's to see).
    Refused(FsError),
    /// `rm` failed: its output.
    Failed(String),
}

impl Op for RemoveTree {
    type Output = Removal;
    const ADMIT: Admit = Admit::Fs;
    const ACCESS: Access = Access::Ordered;

    async fn apply(self, at: Reached) -> Result<Removal, ApiError> {
        let stat = FsStatRequest { path: self.path };
        let r = Fs::new(&at.workspace()).stat(&stat).await;
        let found = respond(r, |v: &mut FsStatResponse, e| v.error = Some(e))?;
        if let Some(e) = found.error {
            return Ok(match e.code {
                FsErrorCode::NotFound => Removal::Absent,
                _ => Removal::Refused(e),
            });
        }
        // The path as the stat checked it (absolute, no `..`), quoted for the shell.
        let path = found.entry.map_or(stat.path, |e| e.path);
        let command = format!("rm -rf -- '{}'", path.replace('\'', r"'\''"));
        let run = RunRequest {
            commands: vec![command],
            fail_fast: false,
            timeout: None,
        };
        let ran = at
            .sessions
            .run(&at.id, at.sessions.run_spec(&run).as_ref())
            .await?;
        Ok(match ran.results.first() {
            Some(r) if r.exit_code == 0 => Removal::Removed,
            Some(r) => Removal::Failed(r.output.clone()),
            None => Removal::Failed("the removal did not run".to_string()),
        })
    }
}
