//! `serve`: the protocol ([`sandbox_protocol`]) on stdin/stdout. The main thread reads frames
//! and dispatches them; each request runs on a thread of its own (`handle` turns it into an op
//! and the op's outcome into its response); one writer thread owns stdout (`out`).
//!
//! Everything a server needs is in its [`Config`]: no process globals.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::mpsc::{Sender, SyncSender, channel, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard};

use rustix::process::{Pid, Signal};
use sandbox_protocol::frame::{Frame, kind, read_frame};
use sandbox_protocol::layout;
use sandbox_protocol::message::{ErrorKind, Event, ProcRequest, Request, Response};

use crate::identity::Identity;
use crate::ops::resolve::Root;
use crate::ops::{Input, InputMsg};

/// How long the helper waits for its shell's first start before it says it is ready (see
/// [`serve`]): far more than a start takes (a few ms), far less than the service waits for the
/// ready (15 s).
const WARM_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

mod handle;
mod out;
mod relay;

use out::Out;

/// Input chunks queued per request.
const IN_QUEUE: usize = 16;

/// What `serve` is told when it starts.
#[derive(Debug, Clone)]
pub struct Config {
    /// The directory served as `/workspace` (`--root`; tests serve a tempdir).
    pub root: PathBuf,
    /// Where the service's root-owned files are (`--service-dir`; the fake engine's tests use
    /// their own): the caller's environment and the seed marker.
    pub service_dir: PathBuf,
    /// The process supervisor's abstract socket (`--processes`).
    pub processes: String,
    /// Who the server is: workspace operations act as its sandbox user.
    pub identity: Identity,
}

impl Default for Config {
    /// A sandbox's: `/workspace`, `/.daiv-sandbox`, the sandbox's supervisor, no uid of its own.
    fn default() -> Self {
        Self {
            root: PathBuf::from(layout::WORKSPACE),
            service_dir: PathBuf::from(layout::SERVICE_DIR),
            processes: layout::PROCESSES_SOCKET.to_string(),
            identity: Identity::Inherited,
        }
    }
}

impl Config {
    /// `layout_path` (a file under [`layout::SERVICE_DIR`]) where this server finds it.
    fn service_file(&self, layout_path: &str) -> PathBuf {
        let path = Path::new(layout_path);
        self.service_dir
            .join(path.strip_prefix(layout::SERVICE_DIR).unwrap_or(path))
    }
}

/// A request in flight.
struct Live {
    cancelled: AtomicBool,
    /// Process group of the command running for it, 0 if none.
    pgid: AtomicI32,
    /// Answer to give instead of "cancelled" (a malformed frame for a live id).
    reason: Mutex<Option<(ErrorKind, String)>>,
    input: Option<InputTx>,
    /// A `connect`'s grants and queue (see [`relay`]).
    credit: Option<Arc<relay::Credit>>,
}

/// Where a request's DATA and EOF go.
#[derive(Clone)]
enum InputTx {
    /// A full queue makes the reader wait: input is worth waiting for.
    Bounded(SyncSender<InputMsg>),
    /// A `connect`'s: never more than the helper granted (checked as it arrives), so the reader
    /// never waits for one connection's socket.
    Granted(Sender<InputMsg>),
}

impl InputTx {
    fn send(&self, msg: InputMsg) {
        let _ = match self {
            InputTx::Bounded(tx) => tx.send(msg),
            InputTx::Granted(tx) => tx.send(msg),
        };
    }
}

/// What every request thread shares.
struct Server {
    config: Config,
    root: Root,
    /// `/`, for the data plane's paths anywhere (the service directory refused); `None` when
    /// the service directory cannot be found (those ops are then refused).
    anywhere: Option<Root>,
    out: Out,
    /// Requests from their REQUEST until their RESPONSE.
    live: Mutex<HashMap<u32, Arc<Live>>>,
    /// Held by the `run` batch that runs (see [`handle`]).
    runs: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Serves the protocol on stdin/stdout as `config` says; returns the exit code (0 at end of
/// input, 2 on a framing error, 1 if the root cannot be opened).
pub fn serve(config: Config) -> i32 {
    // Where the helper has no uid of its own (see `crate::identity`), commands share its uid:
    // without this, one could ptrace it (or write its memory through /proc) and alter what it
    // answers. Children are dumpable again after their exec, so commands are unaffected.
    if let Err(e) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        eprintln!("daiv-sandbox-helper: cannot make itself non-dumpable: {e}");
    }
    let root = match Root::open(&config.root) {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "daiv-sandbox-helper: cannot open {}: {e}",
                config.root.display()
            );
            return 1;
        }
    };
    let anywhere = Root::open_anywhere(&config.service_dir)
        .map_err(|e| {
            eprintln!(
                "daiv-sandbox-helper: paths outside the workspace are refused: cannot stat {}: {e}",
                config.service_dir.display()
            );
        })
        .ok();
    let server = Arc::new(Server {
        config,
        root,
        anywhere,
        out: Out::stdout(),
        live: Mutex::default(),
        runs: Mutex::default(),
    });
    // The shell every command runs in is found (for `sh`, probed with a spawn) and started once
    // before the helper says it is ready, so a new session's first command costs what a later
    // one does: the create that opens this channel answers after it. Bounded: a shell that
    // hangs (the image is the caller's) holds the channel back no longer than `WARM_WAIT`, and
    // a first command then waits for the finding, not for a second probe.
    let (warmed, warm_done) = std::sync::mpsc::channel();
    let warm = server.clone();
    std::thread::spawn(move || {
        crate::ops::run::warm_shell(&warm.config.identity);
        let _ = warmed.send(());
    });
    let _ = warm_done.recv_timeout(WARM_WAIT);
    server.out.event(
        0,
        &Event::Ready {
            protocol: sandbox_protocol::VERSION,
            version: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id(),
        },
    );
    let mut stdin = std::io::stdin().lock();
    let code = loop {
        match read_frame(&mut stdin) {
            Ok(Some(frame)) => dispatch(frame, &server),
            Ok(None) => break 0,
            Err(e) => {
                eprintln!("daiv-sandbox-helper: protocol error: {e}");
                break 2;
            }
        }
    };
    // End of input: nobody is listening; stop every command.
    for live in lock(&server.live).values() {
        live.cancelled.store(true, Ordering::Relaxed);
        let pgid = live.pgid.load(Ordering::Relaxed);
        if let Some(p) = Pid::from_raw(pgid) {
            let _ = rustix::process::kill_process_group(p, Signal::KILL);
        }
    }
    code
}

fn dispatch(frame: Frame, server: &Arc<Server>) {
    let id = frame.id;
    let live = lock(&server.live).get(&id).cloned();
    let out = &server.out;
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
                    | Request::FileWrite { .. }
                    | Request::Extract { .. }
                    | Request::Proc {
                        request: ProcRequest::Stdin { .. }
                    }
            ) {
                let (tx, rx) = sync_channel(IN_QUEUE);
                (Some(InputTx::Bounded(tx)), Some(Input::new(rx)))
            } else if matches!(req, Request::Connect { .. }) {
                let (tx, rx) = channel();
                (Some(InputTx::Granted(tx)), Some(Input::new(rx)))
            } else {
                (None, None)
            };
            let credit = matches!(req, Request::Connect { .. }).then(Arc::default);
            let live = Arc::new(Live {
                cancelled: AtomicBool::new(false),
                pgid: AtomicI32::new(0),
                reason: Mutex::new(None),
                input: input_tx,
                credit,
            });
            lock(&server.live).insert(id, live.clone());
            let t_server = server.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("req-{id}"))
                .spawn(move || {
                    let server = t_server;
                    let response = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        let prepared = handle::Prepared::for_request(&req);
                        // Workspace operations act with the sandbox user's rights: this thread
                        // becomes that user (commands and processes are started as it instead).
                        if handle::touches_workspace(&req)
                            && let Err(e) = server.config.identity.act_as_sandbox_user()
                        {
                            return Response::error(
                                ErrorKind::Internal,
                                format!("cannot act as the sandbox user: {e}"),
                            );
                        }
                        handle::handle(id, req, prepared, input, &server, &live)
                    }))
                    .unwrap_or_else(|_| {
                        Response::error(ErrorKind::Internal, "the helper panicked")
                    });
                    // Forget the id first: once answered, the client may reuse it.
                    lock(&server.live).remove(&id);
                    server.out.response(id, &response);
                });
            if let Err(e) = spawned {
                lock(&server.live).remove(&id);
                out.response(
                    id,
                    &Response::error(ErrorKind::Internal, format!("cannot start a thread: {e}")),
                );
            }
        }
        kind::DATA | kind::EOF => {
            // Input for an id no longer live (answered early) is dropped.
            let Some(live) = live else { return };
            if let (Some(credit), kind::DATA) = (&live.credit, frame.kind) {
                let queued = credit
                    .queued
                    .fetch_add(frame.payload.len() as u64, Ordering::SeqCst);
                if queued + frame.payload.len() as u64 > u64::from(relay::WINDOW) {
                    refuse(&live, "DATA over the window the helper granted");
                    return;
                }
            }
            if let Some(tx) = &live.input {
                tx.send(if frame.kind == kind::DATA {
                    InputMsg::Data(frame.payload)
                } else {
                    InputMsg::Eof
                });
            }
        }
        kind::WINDOW => match (live, sandbox_protocol::frame::window_bytes(&frame.payload)) {
            (Some(live), Some(bytes)) if live.credit.is_some() => {
                if let Some(c) = &live.credit {
                    c.grant(bytes);
                }
            }
            (Some(live), _) => refuse(&live, "a WINDOW frame that is not a connect's grant"),
            // Grants for a connection that ended are dropped.
            (None, _) => {}
        },
        kind::CANCEL => {
            if let Some(l) = live {
                l.cancelled.store(true, Ordering::Relaxed);
            }
        }
        other => {
            let why = format!("unknown frame kind {other}");
            match live {
                Some(l) => refuse(&l, why),
                None => out.response(id, &Response::error(ErrorKind::BadRequest, why)),
            }
        }
    }
}

/// Stops a live request whose client broke the protocol; `why` is its answer.
fn refuse(live: &Live, why: impl Into<String>) {
    *lock(&live.reason) = Some((ErrorKind::BadRequest, why.into()));
    live.cancelled.store(true, Ordering::Relaxed);
}
