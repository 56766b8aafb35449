//! The data plane's operations on paths anywhere (`stat`, `mkdir`, `move`, `list`, E2B's removal
//! of a tree and OpenSandbox's `chmod`): each takes
//! one of the session's fs slots and one of the total (its request is a path or two, read before
//! the slot), the writers the session's lock too. An fs-level problem is inside the answer
//! (`error`), as the `fs/*` ops answer theirs.

use sandbox_protocol::files::{
    FsListRequest, FsListResponse, FsMkdirRequest, FsMkdirResponse, FsMoveRequest, FsMoveResponse,
    FsStatRequest, FsStatResponse, permission_bits,
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
        let removed = as_user(&at, format!("rm -rf -- {}", quoted(&path))).await?;
        Ok(match removed {
            Ok(()) => Removal::Removed,
            Err(out) => Removal::Failed(out),
        })
    }
}

/// `path` as one word for the shell.
fn quoted(path: &str) -> String {
    format!("'{}'", path.replace('\'', r"'\''"))
}

/// `command` run as the sandbox user, in the session's order (the caller holds its lock): its
/// output when it failed.
async fn as_user(at: &Reached, command: String) -> Result<Result<(), String>, ApiError> {
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
        Some(r) if r.exit_code == 0 => Ok(()),
        Some(r) => Err(r.output.clone()),
        None => Err("the command did not run".to_string()),
    })
}

/// A path's permission bits set, anywhere the sandbox user may (OpenSandbox's
/// `/files/permissions`; no fs op changes a mode alone): a `stat`, then `chmod` run as the user,
/// both under the session's lock. `mode` is checked as every request's is
/// ([`permission_bits`]: its permission bits, no setuid, setgid or sticky bit).
pub struct Chmod {
    pub path: String,
    pub mode: u32,
}

/// What a [`Chmod`] did.
#[derive(Debug)]
pub enum Chmodded {
    Done,
    /// The `stat` refused the path (not there, not a path, not the user's to see), or the mode
    /// is none.
    Refused(FsError),
    /// `chmod` failed: its output.
    Failed(String),
}

impl Op for Chmod {
    type Output = Chmodded;
    const ADMIT: Admit = Admit::Fs;
    const ACCESS: Access = Access::Ordered;

    async fn apply(self, at: Reached) -> Result<Chmodded, ApiError> {
        let mode = match permission_bits(self.mode) {
            Ok(m) => m,
            Err(why) => {
                return Ok(Chmodded::Refused(FsError::new(
                    FsErrorCode::InvalidPath,
                    why,
                )));
            }
        };
        let stat = FsStatRequest { path: self.path };
        let r = Fs::new(&at.workspace()).stat(&stat).await;
        let found = respond(r, |v: &mut FsStatResponse, e| v.error = Some(e))?;
        if let Some(e) = found.error {
            return Ok(Chmodded::Refused(e));
        }
        let path = found.entry.map_or(stat.path, |e| e.path);
        let command = format!("chmod {mode:o} -- {}", quoted(&path));
        Ok(match as_user(&at, command).await? {
            Ok(()) => Chmodded::Done,
            Err(out) => Chmodded::Failed(out),
        })
    }
}
