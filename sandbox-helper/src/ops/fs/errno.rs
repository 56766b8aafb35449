//! Errno to fs error: which `FsErrorCode` and message each failure of a syscall becomes, naming
//! only the wire path the client gave (never a host path).

use rustix::io::Errno;
use sandbox_protocol::layout::WORKSPACE;
use sandbox_protocol::wire::FsErrorCode;

use crate::ops::resolve::ResolveError;
use crate::ops::{OpError, fail};

fn describe(e: Errno) -> String {
    std::io::Error::from_raw_os_error(e.raw_os_error()).to_string()
}

/// Any errno without a dedicated code: `exec_failed`, naming only the wire path.
pub(crate) fn errno_fail(e: Errno, path: &str) -> OpError {
    match e {
        Errno::NOSPC => fail(
            FsErrorCode::ExecFailed,
            format!("{path}: no space left on device"),
        ),
        Errno::LOOP => fail(
            FsErrorCode::ExecFailed,
            format!("{path}: too many levels of symbolic links"),
        ),
        e => fail(FsErrorCode::ExecFailed, format!("{path}: {}", describe(e))),
    }
}

pub(crate) fn denied(path: &str) -> OpError {
    fail(
        FsErrorCode::PermissionDenied,
        format!("permission denied: {path}"),
    )
}

fn outside(path: &str) -> OpError {
    fail(
        FsErrorCode::PermissionDenied,
        format!("permission denied: {path}: a symbolic link on the way leads outside {WORKSPACE}"),
    )
}

/// Resolution failures of an existing path. A non-directory in the middle of the path reads as
/// absent, as `[ -e "$p" ]` did.
pub(crate) fn resolve_err(e: ResolveError, path: &str) -> OpError {
    match e {
        ResolveError::Errno(Errno::NOENT | Errno::NOTDIR) => {
            fail(FsErrorCode::NotFound, format!("{path} does not exist"))
        }
        ResolveError::Errno(Errno::ACCESS | Errno::PERM) => denied(path),
        ResolveError::Outside => outside(path),
        ResolveError::Denied => fail(
            FsErrorCode::PermissionDenied,
            format!("permission denied: {path}: the service's own directory is out of reach"),
        ),
        ResolveError::Loop => errno_fail(Errno::LOOP, path),
        ResolveError::Errno(e) => errno_fail(e, path),
    }
}

/// Opening the final entry after resolution (a racing swap shows up here).
pub(crate) fn open_err(e: Errno, path: &str) -> OpError {
    match e {
        Errno::NOENT => fail(FsErrorCode::NotFound, format!("{path} does not exist")),
        Errno::ACCESS | Errno::PERM => denied(path),
        Errno::ISDIR => fail(FsErrorCode::IsADirectory, format!("{path} is a directory")),
        // O_NOFOLLOW met a symlink swapped in, or O_DIRECTORY a non-directory.
        Errno::LOOP | Errno::NXIO => fail(
            FsErrorCode::ExecFailed,
            format!("{path} is not a regular file"),
        ),
        e => errno_fail(e, path),
    }
}

pub(crate) fn io_fail(e: std::io::Error, path: &str) -> OpError {
    match e.raw_os_error() {
        Some(n) => errno_fail(Errno::from_raw_os_error(n), path),
        None => fail(FsErrorCode::ExecFailed, format!("{path}: {e}")),
    }
}
