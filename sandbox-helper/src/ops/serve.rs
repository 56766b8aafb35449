//! The frame loop: the main thread reads stdin and dispatches, each request runs on its own
//! thread, one writer thread owns stdout and serialises frames (flushing whenever it has nothing
//! more queued).

use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};
use serde::Serialize;

use super::extract;
use super::fs::Fs;
use super::procs;
use super::resolve::Root;
use super::run::{self, Emit, RunError, RunSpec};
use super::{Halt, Input, InputMsg, OpError, Stop};
use crate::layout::{self, WORKSPACE};
use crate::protocol::ProcRequest;
use crate::protocol::{
    ErrorKind, Event, MAX_PAYLOAD, Request, Response, VERSION, encode, encode_json, kind,
    read_frame,
};
use crate::wire::FsError;

/// Frames queued for stdout; a full queue makes producers wait (a slow client slows commands
/// instead of growing memory).
const OUT_QUEUE: usize = 256;
/// Input chunks queued per request.
const IN_QUEUE: usize = 16;

/// A request in flight.
struct Live {
    cancelled: AtomicBool,
    /// Process group of the command running for it, 0 if none.
    pgid: AtomicI32,
    /// Answer to give instead of "cancelled" (a malformed frame for a live id).
    reason: Mutex<Option<(ErrorKind, String)>>,
    input: Option<SyncSender<InputMsg>>,
}

type Registry = Arc<Mutex<HashMap<u32, Arc<Live>>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The sending side of stdout.
#[derive(Clone)]
struct Out {
    tx: SyncSender<Vec<u8>>,
}

impl Out {
    fn frame(&self, id: u32, kind: u8, payload: &[u8]) {
        let mut buf = Vec::new();
        encode(id, kind, payload, &mut buf);
        let _ = self.tx.send(buf);
    }

    fn event(&self, id: u32, event: &Event) {
        let mut buf = Vec::new();
        encode_json(id, kind::EVENT, event, &mut buf);
        let _ = self.tx.send(buf);
    }

    /// Sends a response, replaced by an `io` error when it would exceed the frame limit.
    fn response(&self, id: u32, response: &Response) {
        let payload = serde_json::to_vec(response).unwrap_or_else(|_| b"{}".to_vec());
        if payload.len() > MAX_PAYLOAD {
            let too_big = Response::error(
                ErrorKind::Io,
                format!(
                    "the response is {} bytes, over the {MAX_PAYLOAD}-byte frame limit: narrow the request",
                    payload.len()
                ),
            );
            let mut buf = Vec::new();
            encode_json(id, kind::RESPONSE, &too_big, &mut buf);
            let _ = self.tx.send(buf);
            return;
        }
        self.frame(id, kind::RESPONSE, &payload);
    }
}

/// Held by the batch that runs (see [`handle`]).
static RUNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

static SERVICE_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Where [`serve`] finds the service's root-owned files ([`layout::SERVICE_DIR`] unless
/// `--service-dir`; the fake engine's tests use their own).
pub fn set_service_dir(path: &Path) {
    let _ = SERVICE_DIR.set(path.to_path_buf());
}

/// `layout_path` (a file of [`layout::SERVICE_DIR`]) where this helper finds it.
fn service_file(layout_path: &str) -> PathBuf {
    match SERVICE_DIR.get() {
        Some(dir) => dir.join(Path::new(layout_path).file_name().unwrap_or_default()),
        None => PathBuf::from(layout_path),
    }
}

/// The claim's environment ([`layout::ENV_FILE`]), read for every run: a warm-pool member's
/// channel is opened before the member is claimed, so the file may appear after serving
/// started (the control plane writes it before the claim's 201). A few microseconds a run.
fn claimed_env() -> Vec<(String, String)> {
    procs::claimed_env(&service_file(layout::ENV_FILE))
}

/// A run's environment: the claim's, then the request's (which wins).
fn run_env(request: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut env = claimed_env();
    env.extend(request);
    env
}

/// Serves the protocol on stdin/stdout with `root` as `/workspace`; returns the exit code
/// (0 at end of input, 2 on a framing error, 1 if the root cannot be opened).
pub fn serve(root_dir: &Path) -> i32 {
    // Where the helper has no uid of its own (see `crate::identity`), commands share its uid:
    // without this, one could ptrace it (or write its memory through /proc) and alter what it
    // answers. Children are dumpable again after their exec, so commands are unaffected.
    if let Err(e) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        eprintln!("daiv-sandbox-helper: cannot make itself non-dumpable: {e}");
    }
    let root = match Root::open(root_dir) {
        Ok(r) => Arc::new(r),
        Err(e) => {
            eprintln!(
                "daiv-sandbox-helper: cannot open {}: {e}",
                root_dir.display()
            );
            return 1;
        }
    };
    let (tx, rx) = sync_channel::<Vec<u8>>(OUT_QUEUE);
    std::thread::Builder::new()
        .name("stdout".into())
        .spawn(move || {
            let mut w = BufWriter::with_capacity(128 * 1024, std::io::stdout().lock());
            while let Ok(frame) = rx.recv() {
                let mut ok = w.write_all(&frame).is_ok();
                while ok && let Ok(more) = rx.try_recv() {
                    ok = w.write_all(&more).is_ok();
                }
                if !ok || w.flush().is_err() {
                    // The client is gone; nothing more can be said.
                    std::process::exit(0);
                }
            }
        })
        .map_err(|e| eprintln!("daiv-sandbox-helper: {e}"))
        .ok();
    let out = Out { tx };
    out.event(
        0,
        &Event::Ready {
            protocol: VERSION,
            version: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id(),
        },
    );
    let registry: Registry = Arc::default();
    let mut stdin = std::io::stdin().lock();
    let code = loop {
        match read_frame(&mut stdin) {
            Ok(Some(frame)) => dispatch(frame, &root, root_dir, &registry, &out),
            Ok(None) => break 0,
            Err(e) => {
                eprintln!("daiv-sandbox-helper: protocol error: {e}");
                break 2;
            }
        }
    };
    // End of input: nobody is listening; stop every command.
    for live in lock(&registry).values() {
        live.cancelled.store(true, Ordering::Relaxed);
        let pgid = live.pgid.load(Ordering::Relaxed);
        if let Some(p) = Pid::from_raw(pgid) {
            let _ = rustix::process::kill_process_group(p, Signal::KILL);
        }
    }
    code
}

fn dispatch(
    frame: crate::protocol::Frame,
    root: &Arc<Root>,
    root_dir: &Path,
    registry: &Registry,
    out: &Out,
) {
    let id = frame.id;
    let live = lock(registry).get(&id).cloned();
    match frame.kind {
        kind::REQUEST => {
            if id == 0 || live.is_some() {
                let why = if id == 0 {
                    "request id 0 is reserved"
                } else {
                    "request id already in use"
                };
                out.response(id, &Response::error(ErrorKind::BadRequest, why));
                return;
            }
            let req: Request = match serde_json::from_slice(&frame.payload) {
                Ok(r) => r,
                Err(e) => {
                    out.response(
                        id,
                        &Response::error(ErrorKind::BadRequest, format!("invalid request: {e}")),
                    );
                    return;
                }
            };
            let (input_tx, input) = if matches!(
                req,
                Request::Write { .. }
                    | Request::Extract { .. }
                    | Request::Proc {
                        request: ProcRequest::Stdin { .. }
                    }
            ) {
                let (tx, rx) = sync_channel(IN_QUEUE);
                (Some(tx), Some(Input::new(rx)))
            } else {
                (None, None)
            };
            let live = Arc::new(Live {
                cancelled: AtomicBool::new(false),
                pgid: AtomicI32::new(0),
                reason: Mutex::new(None),
                input: input_tx,
            });
            lock(registry).insert(id, live.clone());
            let (t_root, t_registry, t_out) = (root.clone(), registry.clone(), out.clone());
            let root_dir = root_dir.to_path_buf();
            let spawned = std::thread::Builder::new()
                .name(format!("req-{id}"))
                .spawn(move || {
                    let response = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        // Workspace operations act with the sandbox user's rights: this thread
                        // becomes that user (commands and processes are started as it instead).
                        if touches_workspace(&req)
                            && let Err(e) = crate::identity::act_as_sandbox_user()
                        {
                            return Response::error(
                                ErrorKind::Internal,
                                format!("cannot act as the sandbox user: {e}"),
                            );
                        }
                        handle(id, req, input, &t_root, &root_dir, &live, &t_out)
                    }))
                    .unwrap_or_else(|_| {
                        Response::error(ErrorKind::Internal, "the helper panicked")
                    });
                    // Forget the id first: once answered, the client may reuse it.
                    lock(&t_registry).remove(&id);
                    t_out.response(id, &response);
                });
            if let Err(e) = spawned {
                lock(registry).remove(&id);
                out.response(
                    id,
                    &Response::error(ErrorKind::Internal, format!("cannot start a thread: {e}")),
                );
            }
        }
        kind::DATA | kind::EOF => {
            // Input for an id no longer live (answered early) is dropped.
            if let Some(tx) = live.and_then(|l| l.input.clone()) {
                let msg = if frame.kind == kind::DATA {
                    InputMsg::Data(frame.payload)
                } else {
                    InputMsg::Eof
                };
                let _ = tx.send(msg);
            }
        }
        kind::CANCEL => {
            if let Some(l) = live {
                l.cancelled.store(true, Ordering::Relaxed);
            }
        }
        other => {
            let why = format!("unknown frame kind {other}");
            match live {
                Some(l) => {
                    *lock(&l.reason) = Some((ErrorKind::BadRequest, why));
                    l.cancelled.store(true, Ordering::Relaxed);
                }
                None => out.response(id, &Response::error(ErrorKind::BadRequest, why)),
            }
        }
    }
}

/// Requests that read or write the workspace itself (on their own thread, as the sandbox user).
fn touches_workspace(req: &Request) -> bool {
    match req {
        Request::Ls { .. }
        | Request::Read { .. }
        | Request::Grep { .. }
        | Request::Glob { .. }
        | Request::Write { .. }
        | Request::Edit { .. }
        | Request::Delete { .. }
        | Request::Extract { .. }
        | Request::Clear { .. } => true,
        Request::Ping | Request::Seeded | Request::Run { .. } | Request::Proc { .. } => false,
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

/// `/workspace/x` as a path under the served root (tests serve a tempdir); others unchanged.
fn host_path(root_dir: &Path, wire: &str) -> PathBuf {
    match wire.strip_prefix(WORKSPACE) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            root_dir.join(rest.trim_start_matches('/'))
        }
        _ => PathBuf::from(wire),
    }
}

fn handle(
    id: u32,
    req: Request,
    input: Option<Input>,
    root: &Root,
    root_dir: &Path,
    live: &Live,
    out: &Out,
) -> Response {
    let deadline_of = |ms: Option<u64>| ms.map(|ms| Instant::now() + Duration::from_millis(ms));
    let fs_deadline = match &req {
        Request::Ls { deadline_ms, .. }
        | Request::Read { deadline_ms, .. }
        | Request::Grep { deadline_ms, .. }
        | Request::Glob { deadline_ms, .. }
        | Request::Write { deadline_ms, .. }
        | Request::Edit { deadline_ms, .. }
        | Request::Delete { deadline_ms, .. } => Some(*deadline_ms),
        Request::Extract { deadline_ms, .. } | Request::Clear { deadline_ms, .. } => *deadline_ms,
        Request::Ping | Request::Seeded | Request::Run { .. } | Request::Proc { .. } => None,
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
        Request::Seeded => Response::ok(&crate::protocol::SeededInfo {
            seeded: service_file(layout::SEED_MARKER).exists(),
        }),
        Request::Run {
            commands,
            fail_fast,
            timeout_ms,
            output_cap,
            workdir,
            env,
        } => {
            let workdir = host_path(root_dir, &workdir);
            let env = run_env(env);
            let spec = RunSpec {
                commands: &commands,
                fail_fast,
                timeout: timeout_ms.filter(|t| *t > 0).map(Duration::from_millis),
                output_cap,
                workdir: &workdir,
                env: &env,
            };
            let mut emit = |e: Emit<'_>| match e {
                Emit::Event(ev) => out.event(id, &ev),
                Emit::Data(d) => out.frame(id, kind::DATA, d),
            };
            // One batch at a time: the control plane's session lock orders runs, but it is
            // released as soon as a client leaves, while the cancelled batch's process group
            // may take a tick to be killed. The next batch starts only once it is gone.
            let _one = RUNS.lock().unwrap_or_else(|p| p.into_inner());
            match run::run(&spec, &stop, &live.pgid, &mut emit) {
                Ok(()) => Response::empty(),
                Err(RunError::Halt(h)) => halted(h, live, None),
                Err(RunError::Spawn(m)) => Response::error(ErrorKind::Io, m),
            }
        }
        Request::Ls { path, .. } => fs_response(fs.ls(&path), |r, e| r.error = Some(e), live, dl),
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
            ..
        } => fs_response(
            fs.glob(&pattern, &path, &prune),
            |r, e| r.error = Some(e),
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
        Request::Proc { request } => proc_request(id, request, input, root_dir, &stop, out),
        Request::Clear { dest, .. } => match extract::clear(root, &dest, &stop) {
            Ok(()) => Response::empty(),
            Err(OpError::Halt(h)) => halted(h, live, dl),
            Err(OpError::Fail(k, m)) => Response::error(k, m),
            Err(OpError::Fs(e)) => Response::error(ErrorKind::Io, e.message),
        },
    }
}

/// Most stdin bytes one request may carry.
const MAX_STDIN: usize = 1024 * 1024;

/// Relays a background-process request to the container's supervisor.
fn proc_request(
    id: u32,
    mut request: ProcRequest,
    input: Option<Input>,
    root_dir: &Path,
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
        *workdir = host_path(root_dir, workdir).to_string_lossy().into_owned();
    }
    let is_poll = matches!(request, ProcRequest::Poll { .. });
    let (output, response) = procs::call(procs::socket(), &request, data.as_deref());
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
        let dir = std::env::temp_dir().join(format!("daiv-helper-env-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tempdir");
        let file = dir.join("environment");
        std::fs::write(
            &file,
            br#"[["A","claimed"],["B","claimed"],["bad=name","x"]]"#,
        )
        .expect("write");
        set_service_dir(&dir);
        let env = run_env(vec![("B".into(), "request".into())]);
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
            run_env(Vec::new()),
            vec![("A".to_string(), "later".to_string())]
        );
        assert!(procs::claimed_env(&dir.join("absent")).is_empty());
        std::fs::write(&file, b"not json").expect("write");
        assert!(procs::claimed_env(&file).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
