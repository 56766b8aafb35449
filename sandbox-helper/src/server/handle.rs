//! One request: the op it asks for, run with its cancel flag and deadline, and the op's outcome
//! as its response (fs-level failures inside the fs answer, halts and failures as errors).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandbox_protocol::files::{
    FileAnswer, FsListResponse, FsMkdirResponse, FsMoveResponse, FsStatResponse, validate_any_path,
};
use sandbox_protocol::frame::kind;
use sandbox_protocol::layout::{self, WORKSPACE};
use sandbox_protocol::message::{ErrorKind, Event, ProcRequest, Request, Response, SeededInfo};
use sandbox_protocol::wire::{FsError, FsGlobResponse, FsLsResponse};
use serde::Serialize;

use super::out::Out;
use super::{Config, Live, Server, lock};
use crate::env_file::claimed_env;
use crate::ops::files::{Files, range_of};
use crate::ops::fs::{Fs, Listing};
use crate::ops::run::{self, Emit, RunError, RunSpec};
use crate::ops::{Halt, Input, OpError, Stop, extract, watch};
use crate::procs::client;

/// A run's environment: the caller's, then the request's (which wins). The caller's
/// ([`layout::ENV_FILE`]) is read for every run: a warm-pool member's channel is opened before
/// the member is claimed, so the file may change after serving started (the control plane
/// writes it before the claim answers). A few microseconds a run.
fn run_env(config: &Config, request: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut env = claimed_env(&config.service_file(layout::ENV_FILE));
    env.extend(request);
    env
}

/// Requests that read or write the workspace itself (on their own thread, as the sandbox user).
pub(super) fn touches_workspace(req: &Request) -> bool {
    match req {
        Request::Ls { .. }
        | Request::Read { .. }
        | Request::Grep { .. }
        | Request::Glob { .. }
        | Request::Write { .. }
        | Request::Edit { .. }
        | Request::Delete { .. }
        | Request::Extract { .. }
        | Request::Clear { .. }
        | Request::Stat { .. }
        | Request::Mkdir { .. }
        | Request::Move { .. }
        | Request::List { .. }
        | Request::FileRead { .. }
        | Request::FileWrite { .. }
        | Request::Watch { .. }
        | Request::Disk => true,
        Request::Ping
        | Request::Seeded
        | Request::Run { .. }
        | Request::Proc { .. }
        | Request::Connect { .. } => false,
    }
}

fn halted(h: Halt, live: &Live, deadline_ms: Option<u64>) -> Response {
    match h {
        Halt::Cancelled => match lock(&live.reason).take() {
            Some((kind, why)) => Response::error(kind, why),
            None => Response::error(ErrorKind::Cancelled, "cancelled"),
        },
        Halt::Deadline => Response::error(
            ErrorKind::Deadline,
            format!(
                "the operation did not finish within its deadline of {} ms",
                deadline_ms.unwrap_or_default()
            ),
        ),
    }
}

/// Folds an fs op's outcome into its response: fs errors into the wire type's `error`.
fn fs_response<T: Serialize + Default>(
    r: Result<T, OpError>,
    set: impl FnOnce(&mut T, FsError),
    live: &Live,
    deadline_ms: Option<u64>,
) -> Response {
    match r {
        Ok(v) => Response::ok(&v),
        Err(OpError::Fs(e)) => {
            let mut v = T::default();
            set(&mut v, e);
            Response::ok(&v)
        }
        Err(OpError::Halt(h)) => halted(h, live, deadline_ms),
        Err(OpError::Fail(kind, m)) => Response::error(kind, m),
    }
}

/// An `ls` or `glob`: the `listing` event and its chunks, then ok `{}`; or its fs error in the
/// op's wire type (`T`), nothing streamed.
fn listing_response<T: Serialize + Default>(
    id: u32,
    r: Result<Listing, OpError>,
    set: impl FnOnce(&mut T, FsError),
    server: &Server,
    live: &Live,
    deadline_ms: Option<u64>,
) -> Response {
    match r {
        Ok(listing) => {
            let out = &server.out;
            out.event(
                id,
                &Event::Listing {
                    entries: listing.count(),
                    bytes: listing.bytes(),
                },
            );
            match listing.send(&mut |d| out.frame(id, kind::DATA, d), &live.cancelled) {
                Ok(()) => Response::empty(),
                Err(h) => halted(h, live, deadline_ms),
            }
        }
        Err(e) => fs_response(Err::<T, _>(e), set, live, deadline_ms),
    }
}

/// `/workspace/x` as a path under the served root (tests serve a tempdir); others unchanged.
fn host_path(root_dir: &Path, wire: &str) -> PathBuf {
    match wire.strip_prefix(WORKSPACE) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            root_dir.join(rest.trim_start_matches('/'))
        }
        _ => PathBuf::from(wire),
    }
}

/// What a request takes from the helper's own uid before its thread acts as the sandbox user.
#[derive(Default)]
pub(super) struct Prepared {
    /// A watch's inotify instance. The kernel counts an instance, and every watch added to it,
    /// against the per-uid limits (`fs.inotify.max_user_instances`, `max_user_watches`) of the
    /// uid that created it: the helper's, which no code in any sandbox runs as. Created as the
    /// sandbox user, a session's code holding that user's instances (shared by every runc
    /// sandbox of the same uid on the host) would fail every other session's watches.
    inotify: Option<std::io::Result<inotify::Inotify>>,
}

impl Prepared {
    /// Call it on the request's thread before it takes the sandbox user's ids.
    pub(super) fn for_request(req: &Request) -> Self {
        Self {
            inotify: matches!(req, Request::Watch { .. }).then(inotify::Inotify::init),
        }
    }
}

/// Runs request `id` to its response (the caller sends it).
pub(super) fn handle(
    id: u32,
    req: Request,
    prepared: Prepared,
    input: Option<Input>,
    server: &Server,
    live: &Live,
) -> Response {
    let root = &server.root;
    let out = &server.out;
    let deadline_of = |ms: Option<u64>| ms.map(|ms| Instant::now() + Duration::from_millis(ms));
    let fs_deadline = match &req {
        Request::Ls { deadline_ms, .. }
        | Request::Read { deadline_ms, .. }
        | Request::Grep { deadline_ms, .. }
        | Request::Glob { deadline_ms, .. }
        | Request::Write { deadline_ms, .. }
        | Request::Edit { deadline_ms, .. }
        | Request::Delete { deadline_ms, .. }
        | Request::Stat { deadline_ms, .. }
        | Request::Mkdir { deadline_ms, .. }
        | Request::Move { deadline_ms, .. }
        | Request::List { deadline_ms, .. } => Some(*deadline_ms),
        Request::FileRead { .. } | Request::FileWrite { .. } | Request::Watch { .. } => None,
        Request::Extract { deadline_ms, .. } | Request::Clear { deadline_ms, .. } => *deadline_ms,
        Request::Ping
        | Request::Seeded
        | Request::Disk
        | Request::Run { .. }
        | Request::Proc { .. }
        | Request::Connect { .. } => None,
    };
    let stop = Stop {
        cancelled: &live.cancelled,
        deadline: deadline_of(fs_deadline),
    };
    let fs = Fs { root, stop: &stop };
    let dl = fs_deadline;
    match req {
        Request::Ping => Response::empty(),
        // The root-owned marker: the sandbox user can neither create nor remove it.
        Request::Seeded => Response::ok(&SeededInfo {
            seeded: server.config.service_file(layout::SEED_MARKER).exists(),
        }),
        Request::Disk => match crate::disk::usage(&server.config.root) {
            Ok(info) => Response::ok(&info),
            Err(e) => Response::error(ErrorKind::Io, e.to_string()),
        },
        Request::Run {
            commands,
            fail_fast,
            timeout_ms,
            output_cap,
            workdir,
            env,
            split,
        } => {
            let workdir = host_path(&server.config.root, &workdir);
            let env = run_env(&server.config, env);
            let spec = RunSpec {
                commands: &commands,
                fail_fast,
                timeout: timeout_ms.filter(|t| *t > 0).map(Duration::from_millis),
                output_cap,
                workdir: &workdir,
                env: &env,
                split,
                identity: &server.config.identity,
            };
            let mut emit = |e: Emit<'_>| match e {
                Emit::Event(ev) => out.event(id, &ev),
                Emit::Data(d) => out.frame(id, kind::DATA, d),
                Emit::Stderr(d) => out.frame(id, kind::STDERR, d),
            };
            // One batch at a time: the control plane's session lock orders runs, but it is
            // released as soon as a client leaves, while the cancelled batch's process group
            // may take a tick to be killed. The next batch starts only once it is gone.
            let _one = lock(&server.runs);
            match run::run(&spec, &stop, &live.pgid, &mut emit) {
                Ok(()) => Response::empty(),
                Err(RunError::Halt(h)) => halted(h, live, None),
                Err(RunError::Spawn(m)) => Response::error(ErrorKind::Io, m),
            }
        }
        Request::Ls {
            path, max_bytes, ..
        } => listing_response(
            id,
            fs.ls(&path, max_bytes),
            |r: &mut FsLsResponse, e| r.error = Some(e),
            server,
            live,
            dl,
        ),
        Request::Read {
            path,
            offset,
            limit,
            ..
        } => fs_response(
            fs.read(&path, offset, limit),
            |r, e| r.error = Some(e),
            live,
            dl,
        ),
        Request::Grep {
            pattern,
            path,
            glob,
            prune,
            ..
        } => fs_response(
            fs.grep(&pattern, &path, glob.as_deref(), &prune),
            |r, e| r.error = Some(e),
            live,
            dl,
        ),
        Request::Glob {
            pattern,
            path,
            prune,
            max_bytes,
            ..
        } => listing_response(
            id,
            fs.glob(&pattern, &path, &prune, max_bytes),
            |r: &mut FsGlobResponse, e| r.error = Some(e),
            server,
            live,
            dl,
        ),
        Request::Write { path, mode, .. } => {
            let Some(mut input) = input else {
                return Response::error(ErrorKind::Internal, "no input stream");
            };
            let r = fs.write(&path, mode, &mut input);
            // Answer after EOF whatever happened, so no input frame outlives the answer.
            if let Err(h) = input.drain(&stop) {
                return halted(h, live, dl);
            }
            fs_response(r, |r, e| r.error = Some(e), live, dl)
        }
        Request::Edit {
            path,
            old,
            new,
            replace_all,
            ..
        } => fs_response(
            fs.edit(&path, &old, &new, replace_all),
            |r, e| r.error = Some(e),
            live,
            dl,
        ),
        Request::Delete { path, .. } => {
            fs_response(fs.delete(&path), |r, e| r.error = Some(e), live, dl)
        }
        Request::Extract { dest, .. } => {
            let Some(mut input) = input else {
                return Response::error(ErrorKind::Internal, "no input stream");
            };
            let r = extract::extract(root, &dest, &mut input, &stop);
            if let Err(h) = input.drain(&stop) {
                return halted(h, live, dl);
            }
            match r {
                Ok(stats) => Response::ok(&stats),
                Err(OpError::Halt(h)) => halted(h, live, dl),
                Err(OpError::Fail(k, m)) => Response::error(k, m),
                Err(OpError::Fs(e)) => Response::error(ErrorKind::Io, e.message),
            }
        }
        Request::Proc { request } => proc_request(id, request, input, &server.config, &stop, out),
        Request::Connect { port, window } => match input {
            Some(input) => super::relay::connect(id, port, window, input, server, live),
            None => Response::error(ErrorKind::Internal, "a connect without its input"),
        },
        Request::Stat { .. }
        | Request::Mkdir { .. }
        | Request::Move { .. }
        | Request::List { .. }
        | Request::FileRead { .. }
        | Request::FileWrite { .. }
        | Request::Watch { .. } => data_plane(id, req, prepared, input, server, live, &stop),
        Request::Clear { dest, .. } => match extract::clear(root, &dest, &stop) {
            Ok(()) => Response::empty(),
            Err(OpError::Halt(h)) => halted(h, live, dl),
            Err(OpError::Fail(k, m)) => Response::error(k, m),
            Err(OpError::Fs(e)) => Response::error(ErrorKind::Io, e.message),
        },
    }
}

/// The data plane's requests: paths anywhere, resolved from `/` (a `/workspace/...` path maps
/// under the served root first), the service directory refused.
fn data_plane(
    id: u32,
    req: Request,
    prepared: Prepared,
    input: Option<Input>,
    server: &Server,
    live: &Live,
    stop: &Stop<'_>,
) -> Response {
    let Some(root) = &server.anywhere else {
        return Response::error(
            ErrorKind::Io,
            "paths outside the workspace are not served by this helper",
        );
    };
    let files = Files { root, stop };
    // A lexically valid path, and where the helper finds it.
    let arg = |p: &str| -> Result<(String, String), FsError> {
        let shown = validate_any_path(p)?;
        let host = host_path(&server.config.root, &shown)
            .to_string_lossy()
            .into_owned();
        Ok((host, shown))
    };
    macro_rules! path_or_answer {
        ($p:expr, $t:ty) => {
            match arg($p) {
                Ok(v) => v,
                Err(e) => {
                    let mut v = <$t>::default();
                    v.error = Some(e);
                    return Response::ok(&v);
                }
            }
        };
    }
    let dl = None;
    match req {
        Request::Stat { path, .. } => {
            let (host, shown) = path_or_answer!(&path, FsStatResponse);
            fs_response(
                files.stat(&host, &shown),
                |r, e| r.error = Some(e),
                live,
                dl,
            )
        }
        Request::Mkdir { path, parents, .. } => {
            let (host, shown) = path_or_answer!(&path, FsMkdirResponse);
            fs_response(
                files.mkdir(&host, &shown, parents),
                |r, e| r.error = Some(e),
                live,
                dl,
            )
        }
        Request::Move {
            source,
            destination,
            ..
        } => {
            let (src, src_shown) = path_or_answer!(&source, FsMoveResponse);
            let (dst, dst_shown) = path_or_answer!(&destination, FsMoveResponse);
            fs_response(
                files.rename(&src, &src_shown, &dst, &dst_shown),
                |r, e| r.error = Some(e),
                live,
                dl,
            )
        }
        Request::List { path, depth, .. } => {
            let (host, shown) = path_or_answer!(&path, FsListResponse);
            fs_response(
                files.list(&host, &shown, depth),
                |r, e| r.error = Some(e),
                live,
                dl,
            )
        }
        Request::FileRead { path, range } => {
            let (host, shown) = path_or_answer!(&path, FileAnswer);
            let r = files.open_read(&host, &shown).and_then(|(file, size)| {
                let (start, length) = range_of(range, size).map_err(OpError::Fs)?;
                server.out.event(
                    id,
                    &Event::File {
                        size,
                        start,
                        length,
                    },
                );
                let mut send = |d: &[u8]| server.out.frame(id, kind::DATA, d);
                let bytes = files.send_range(&file, start, length, &shown, &mut send)?;
                Ok(FileAnswer { bytes, error: None })
            });
            fs_response(r, |r, e| r.error = Some(e), live, dl)
        }
        Request::FileWrite {
            path,
            mode,
            parents,
            max_bytes,
            in_place,
            metadata,
        } => {
            let Some(mut input) = input else {
                return Response::error(ErrorKind::Internal, "no input stream");
            };
            if let Some(Err(why)) = mode.map(sandbox_protocol::files::permission_bits) {
                let _ = input.drain(stop);
                return Response::error(ErrorKind::BadRequest, why);
            }
            let r = match arg(&path) {
                Ok((host, shown)) => {
                    let how = super::super::ops::files::WriteHow {
                        mode,
                        parents,
                        max_bytes,
                        in_place,
                        metadata,
                    };
                    files.write(&host, &shown, how, &mut input)
                }
                Err(e) => Err(OpError::Fs(e)),
            };
            if let Err(h) = input.drain(stop) {
                return halted(h, live, dl);
            }
            fs_response(r, |r, e| r.error = Some(e), live, dl)
        }
        Request::Watch { path, recursive } => {
            let (host, shown) = path_or_answer!(&path, FileAnswer);
            let mut emit = |e: Event| server.out.event(id, &e);
            let ino = prepared
                .inotify
                .unwrap_or_else(|| Err(std::io::Error::other("no inotify instance prepared")));
            let r =
                watch::watch(root, ino, &host, &shown, recursive, stop, &mut emit).map(|sent| {
                    FileAnswer {
                        bytes: sent,
                        error: None,
                    }
                });
            fs_response(r, |r, e| r.error = Some(e), live, dl)
        }
        _ => Response::error(ErrorKind::Internal, "not a data-plane request"),
    }
}

/// Most stdin bytes one request may carry.
const MAX_STDIN: usize = 1024 * 1024;

/// Relays a background-process request to the container's supervisor.
fn proc_request(
    id: u32,
    mut request: ProcRequest,
    input: Option<Input>,
    config: &Config,
    stop: &Stop<'_>,
    out: &Out,
) -> Response {
    let mut data = None;
    if let Some(mut input) = input {
        let mut buf = Vec::new();
        loop {
            match input.next(stop) {
                Ok(Some(d)) => {
                    if buf.len() + d.len() > MAX_STDIN {
                        let _ = input.drain(stop);
                        return Response::error(
                            ErrorKind::BadRequest,
                            format!("stdin writes are limited to {MAX_STDIN} bytes per request"),
                        );
                    }
                    buf.extend_from_slice(&d);
                }
                Ok(None) => break,
                Err(h) => return Response::error(ErrorKind::Cancelled, format!("{h:?}")),
            }
        }
        data = Some(buf);
    }
    if let ProcRequest::Start { workdir, .. } = &mut request {
        *workdir = host_path(&config.root, workdir)
            .to_string_lossy()
            .into_owned();
    }
    // A poll's and an events request's output: one DATA frame before the answer.
    let is_poll = matches!(
        request,
        ProcRequest::Poll { .. } | ProcRequest::Events { .. }
    );
    let (output, response) = client::call(
        &config.processes,
        &config.identity,
        &request,
        data.as_deref(),
    );
    if is_poll && matches!(response, Response::Ok(_)) {
        out.frame(id, kind::DATA, &output);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claims_environment_comes_first_and_the_request_wins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config {
            service_dir: dir.path().to_path_buf(),
            ..Config::default()
        };
        // Where a sandbox has it: the session's own volume inside the service directory.
        std::fs::create_dir(dir.path().join("session")).expect("mkdir");
        let file = dir.path().join("session/environment");
        assert_eq!(config.service_file(layout::ENV_FILE), file);
        assert!(run_env(&config, Vec::new()).is_empty(), "no claim, no file");
        std::fs::write(
            &file,
            br#"[["A","claimed"],["B","claimed"],["bad=name","x"]]"#,
        )
        .expect("write");
        let env = run_env(&config, vec![("B".into(), "request".into())]);
        assert_eq!(
            env,
            vec![
                ("A".to_string(), "claimed".to_string()),
                ("B".to_string(), "claimed".to_string()),
                ("B".to_string(), "request".to_string()),
            ]
        );
        // Written after serving started (a pool member claimed with its channel open).
        std::fs::write(&file, br#"[["A","later"]]"#).expect("write");
        assert_eq!(
            run_env(&config, Vec::new()),
            vec![("A".to_string(), "later".to_string())]
        );
    }

    #[test]
    fn workspace_paths_map_under_the_served_root() {
        let root = Path::new("/tmp/served");
        assert_eq!(host_path(root, "/workspace"), root);
        assert_eq!(
            host_path(root, "/workspace/repo/sub"),
            root.join("repo/sub")
        );
        assert_eq!(host_path(root, "/workspacex/a"), Path::new("/workspacex/a"));
        assert_eq!(host_path(root, "/usr/bin"), Path::new("/usr/bin"));
    }
}
