//! The data plane's operations on paths anywhere (`stat`, `mkdir`, `move`, `list`): each takes
//! one of the session's fs slots and one of the total (its request is a path or two, read before
//! the slot), the writers the session's lock too. An fs-level problem is inside the answer
//! (`error`), as the `fs/*` ops answer theirs.

use sandbox_protocol::files::{
    FsListRequest, FsListResponse, FsMkdirRequest, FsMkdirResponse, FsMoveRequest, FsMoveResponse,
    FsStatRequest, FsStatResponse,
};

use super::{Access, Admit, Op, Reached};
use crate::error::ApiError;
use crate::workspace::fs::{Fs, respond};

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
