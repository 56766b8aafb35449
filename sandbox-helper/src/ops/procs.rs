//! Background processes: started by one request, outliving it, polled and killed by later ones.
//!
//! They belong to the container, not to a channel: the `init` helper (the container's
//! keep-alive, child of tini) supervises them and answers on an abstract unix socket, so every
//! `serve` instance (each replica's channel, a channel re-opened after the helper died or the
//! control plane restarted) sees the same processes. They die with the container, so a stopped
//! session starts again with none.
//!
//! On the socket, one request per connection, in the frames of [`crate::protocol`]: a REQUEST
//! (a [`ProcRequest`]), for `stdin` one DATA frame; the answer is an optional DATA frame (output
//! of a `poll`) and a RESPONSE. The supervisor and `serve` run under the helper's own uid (see
//! [`crate::identity`]) and speak only to each other: each checks the other's uid on the socket.
//! The processes run as the sandbox user.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{ChildStdin, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

use super::run::shell;
use crate::identity::{self, sandbox_command};
use crate::layout::{ENV_FILE, PROCESSES_SOCKET};
use crate::protocol::{
    ErrorKind, PollInfo, ProcInfo, ProcRequest, Response, encode, encode_json, kind, read_frame,
};

/// Finished processes kept for their exit code and output; older ones are forgotten first.
const KEEP_FINISHED: usize = 32;
/// How long a `stdin` write may wait for a process that does not read.
const STDIN_WAIT: Duration = Duration::from_secs(10);
/// Longest a poll may wait, whatever it asks.
const MAX_WAIT: Duration = Duration::from_secs(300);

struct Output {
    buf: VecDeque<u8>,
    cap: usize,
    /// Bytes ever written; `total - buf.len()` is the offset of `buf[0]`.
    total: u64,
    exit_code: Option<i64>,
    pipe_closed: bool,
}

struct Proc {
    id: String,
    command: String,
    pgid: i32,
    stdin: Mutex<Option<ChildStdin>>,
    out: Mutex<Output>,
    changed: Condvar,
    /// Start order, to forget the oldest finished first.
    seq: u64,
}

#[derive(Default)]
struct Table {
    procs: HashMap<String, Arc<Proc>>,
    next: u64,
}

static SOCKET: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Names the supervisor's socket for this process (`--processes NAME`; tests run several).
pub fn set_socket(name: &str) {
    let _ = SOCKET.set(name.to_string());
}

/// The supervisor's socket name.
pub fn socket() -> &'static str {
    SOCKET.get().map_or(PROCESSES_SOCKET, String::as_str)
}

/// The claim's environment from `path`; none when the file is absent (a session that was not
/// claimed from a pool). An unreadable or malformed file is reported and counts as empty.
pub fn claimed_env(path: &std::path::Path) -> Vec<(String, String)> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            eprintln!("daiv-sandbox-helper: cannot read {}: {e}", path.display());
            return Vec::new();
        }
    };
    match serde_json::from_slice::<Vec<(String, String)>>(&bytes) {
        Ok(env) => env
            .into_iter()
            .filter(|(k, v)| !k.is_empty() && !k.contains(['=', '\0']) && !v.contains('\0'))
            .collect(),
        Err(e) => {
            eprintln!("daiv-sandbox-helper: {} is malformed: {e}", path.display());
            Vec::new()
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn abstract_addr(name: &str) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(name.as_bytes())
}

/// `init`: keeps the container alive and supervises its background processes. Returns only if
/// the socket cannot be bound (then the caller just parks: commands still work).
pub fn supervise(name: &str) -> io::Result<()> {
    let listener = UnixListener::bind_addr(&abstract_addr(name)?)?;
    let table = Arc::new(Mutex::new(Table::default()));
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        // Only `serve` (the helper's own uid) may start, list or kill processes: a command that
        // could would make work the reaper counts as use, past the per-session limit.
        match rustix::net::sockopt::socket_peercred(&conn) {
            Ok(peer) if identity::trusted_peer(peer.uid.as_raw()) => {}
            _ => continue,
        }
        let table = table.clone();
        let _ = std::thread::Builder::new()
            .name("proc-conn".into())
            .spawn(move || {
                let _ = serve_conn(conn, &table);
            });
    }
    Ok(())
}

fn serve_conn(mut conn: UnixStream, table: &Mutex<Table>) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    conn.set_write_timeout(Some(Duration::from_secs(30)))?;
    let Some(frame) = read_frame(&mut conn).map_err(io::Error::other)? else {
        return Ok(());
    };
    let mut reply = Vec::new();
    let response = match serde_json::from_slice::<ProcRequest>(&frame.payload) {
        Err(e) => Response::error(ErrorKind::BadRequest, format!("invalid request: {e}")),
        Ok(ProcRequest::Stdin { process_id, eof }) => {
            let data = match read_frame(&mut conn).map_err(io::Error::other)? {
                Some(f) if f.kind == kind::DATA => f.payload,
                _ => Vec::new(),
            };
            stdin(table, &process_id, &data, eof)
        }
        Ok(ProcRequest::Poll {
            process_id,
            offset,
            wait_ms,
            max_bytes,
        }) => match poll(table, &process_id, offset, wait_ms, max_bytes) {
            Ok((info, data)) => {
                encode(0, kind::DATA, &data, &mut reply);
                Response::ok(&info)
            }
            Err(r) => r,
        },
        Ok(req) => handle(table, req),
    };
    encode_json(0, kind::RESPONSE, &response, &mut reply);
    conn.write_all(&reply)
}

fn not_found(id: &str) -> Response {
    Response::error(ErrorKind::NotFound, format!("no process {id}"))
}

fn find(table: &Mutex<Table>, id: &str) -> Result<Arc<Proc>, Response> {
    lock(table)
        .procs
        .get(id)
        .cloned()
        .ok_or_else(|| not_found(id))
}

fn info(p: &Proc) -> ProcInfo {
    let exit_code = lock(&p.out).exit_code;
    ProcInfo {
        process_id: p.id.clone(),
        command: p.command.clone(),
        running: exit_code.is_none(),
        exit_code,
    }
}

fn handle(table: &Mutex<Table>, req: ProcRequest) -> Response {
    match req {
        ProcRequest::Start {
            command,
            workdir,
            env,
            max_live,
            buffer_bytes,
        } => match start(table, command, &workdir, &env, max_live, buffer_bytes) {
            Ok(id) => Response::ok(&serde_json::json!({ "process_id": id })),
            Err(r) => r,
        },
        ProcRequest::List => {
            let mut procs: Vec<Arc<Proc>> = lock(table).procs.values().cloned().collect();
            procs.sort_by_key(|p| p.seq);
            let list: Vec<ProcInfo> = procs.iter().map(|p| info(p)).collect();
            Response::ok(&serde_json::json!({ "processes": list }))
        }
        ProcRequest::Kill { process_id } => match find(table, &process_id) {
            Ok(p) => {
                if lock(&p.out).exit_code.is_none()
                    && let Some(pid) = Pid::from_raw(p.pgid)
                {
                    let _ = rustix::process::kill_process_group(pid, Signal::KILL);
                }
                Response::empty()
            }
            Err(r) => r,
        },
        ProcRequest::Poll { .. } | ProcRequest::Stdin { .. } => {
            Response::error(ErrorKind::Internal, "handled by the connection")
        }
    }
}

fn random_hex() -> String {
    let mut b = [0u8; 6];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        b.copy_from_slice(&t.to_le_bytes()[..6]);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn start(
    table: &Mutex<Table>,
    command: String,
    workdir: &str,
    env: &[(String, String)],
    max_live: u32,
    buffer_bytes: u64,
) -> Result<String, Response> {
    let Some((program, flags)) = shell().argv() else {
        return Err(Response::error(
            ErrorKind::Io,
            "this image has no shell to run a process with",
        ));
    };
    let mut t = lock(table);
    let live = t
        .procs
        .values()
        .filter(|p| lock(&p.out).exit_code.is_none())
        .count();
    if live >= max_live as usize {
        return Err(Response::error(
            ErrorKind::Limit,
            format!(
                "{live} processes are running, the limit per session is {max_live}: wait for one to end or kill one"
            ),
        ));
    }
    let spawn_err = |e: io::Error| {
        Response::error(
            ErrorKind::Io,
            format!("cannot start {} in {workdir}: {e}", program.display()),
        )
    };
    let (mut reader, writer) = io::pipe().map_err(spawn_err)?;
    let mut child = {
        let mut cmd = sandbox_command(program);
        cmd.args(flags)
            .arg(&command)
            .stdin(Stdio::piped())
            .stdout(writer.try_clone().map_err(spawn_err)?)
            .stderr(writer)
            .current_dir(workdir)
            // Read at each start: the claim writes it after this supervisor started.
            .envs(claimed_env(std::path::Path::new(ENV_FILE)))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .process_group(0);
        cmd.spawn().map_err(spawn_err)?
    };
    t.next += 1;
    let seq = t.next;
    let id = format!("p{seq}-{}", random_hex());
    let proc = Arc::new(Proc {
        id: id.clone(),
        command,
        pgid: i32::try_from(child.id()).unwrap_or(0),
        stdin: Mutex::new(child.stdin.take()),
        out: Mutex::new(Output {
            buf: VecDeque::new(),
            cap: usize::try_from(buffer_bytes.max(1)).unwrap_or(usize::MAX),
            total: 0,
            exit_code: None,
            pipe_closed: false,
        }),
        changed: Condvar::new(),
        seq,
    });
    t.procs.insert(id.clone(), proc.clone());
    forget_old(&mut t);
    drop(t);

    let p = proc.clone();
    let _ = std::thread::Builder::new()
        .name("proc-out".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let mut o = lock(&p.out);
                        o.total += n as u64;
                        o.buf.extend(&buf[..n]);
                        let excess = o.buf.len().saturating_sub(o.cap);
                        o.buf.drain(..excess);
                        drop(o);
                        p.changed.notify_all();
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            lock(&p.out).pipe_closed = true;
            p.changed.notify_all();
        });
    let p = proc;
    let _ = std::thread::Builder::new()
        .name("proc-wait".into())
        .spawn(move || {
            let status = child.wait();
            let code = match status {
                Ok(s) => match (s.code(), s.signal()) {
                    (Some(c), _) => i64::from(c),
                    (None, Some(sig)) => 128 + i64::from(sig),
                    (None, None) => -1,
                },
                Err(_) => -1,
            };
            // Give the reader a moment to take what the shell printed last, so a poll that
            // sees the exit code also sees the whole output (unless a child keeps the pipe).
            let mut o = lock(&p.out);
            let until = Instant::now() + Duration::from_millis(200);
            while !o.pipe_closed {
                let now = Instant::now();
                if now >= until {
                    break;
                }
                o = p
                    .changed
                    .wait_timeout(o, until - now)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
            o.exit_code = Some(code);
            drop(o);
            *lock(&p.stdin) = None;
            p.changed.notify_all();
        });
    Ok(id)
}

/// Forgets the oldest finished processes beyond [`KEEP_FINISHED`].
fn forget_old(t: &mut Table) {
    let mut finished: Vec<(u64, String)> = t
        .procs
        .values()
        .filter(|p| lock(&p.out).exit_code.is_some())
        .map(|p| (p.seq, p.id.clone()))
        .collect();
    if finished.len() <= KEEP_FINISHED {
        return;
    }
    finished.sort();
    for (_, id) in &finished[..finished.len() - KEEP_FINISHED] {
        t.procs.remove(id);
    }
}

fn poll(
    table: &Mutex<Table>,
    id: &str,
    offset: u64,
    wait_ms: u64,
    max_bytes: u64,
) -> Result<(PollInfo, Vec<u8>), Response> {
    let p = find(table, id)?;
    let until = Instant::now() + Duration::from_millis(wait_ms).min(MAX_WAIT);
    let mut o = lock(&p.out);
    // Long poll: wait while there is nothing new and the process still runs.
    while offset >= o.total && o.exit_code.is_none() {
        let now = Instant::now();
        if now >= until {
            break;
        }
        o = p
            .changed
            .wait_timeout(o, until - now)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
    }
    let first = o.total - o.buf.len() as u64;
    let from = offset.clamp(first, o.total);
    let skip = (from - first) as usize;
    let take = (o.buf.len() - skip).min(usize::try_from(max_bytes).unwrap_or(usize::MAX));
    let data: Vec<u8> = o.buf.range(skip..skip + take).copied().collect();
    let info = PollInfo {
        process_id: p.id.clone(),
        running: o.exit_code.is_none(),
        exit_code: o.exit_code,
        offset: from,
        next_offset: from + take as u64,
        truncated: offset < first,
    };
    Ok((info, data))
}

fn stdin(table: &Mutex<Table>, id: &str, data: &[u8], eof: bool) -> Response {
    let p = match find(table, id) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let mut guard = lock(&p.stdin);
    let ended = lock(&p.out).exit_code.is_some();
    let Some(pipe) = guard.as_mut().filter(|_| !ended) else {
        return Response::error(
            ErrorKind::Conflict,
            if ended {
                "the process has ended"
            } else {
                "the process's stdin is closed"
            },
        );
    };
    if let Err(e) = write_within(pipe, data, STDIN_WAIT) {
        return Response::error(
            ErrorKind::Conflict,
            format!("the process does not take its input: {e}"),
        );
    }
    if eof {
        *guard = None;
    }
    Response::empty()
}

/// Writes all of `data` without blocking for longer than `limit` in total.
fn write_within(pipe: &mut ChildStdin, data: &[u8], limit: Duration) -> io::Result<()> {
    rustix::io::ioctl_fionbio(&*pipe, true)?;
    let until = Instant::now() + limit;
    let mut rest = data;
    while !rest.is_empty() {
        match pipe.write(rest) {
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let now = Instant::now();
                if now >= until {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "its stdin is full"));
                }
                let wait = (until - now).min(Duration::from_millis(50));
                let mut fds = [rustix::event::PollFd::new(
                    &*pipe,
                    rustix::event::PollFlags::OUT,
                )];
                let ts = rustix::event::Timespec {
                    tv_sec: wait.as_secs() as _,
                    tv_nsec: wait.subsec_nanos() as _,
                };
                let _ = rustix::event::poll(&mut fds, Some(&ts));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// How long the supervisor may take to answer beyond what the request itself may wait: a
/// stopped or wedged supervisor costs a request this much, never a thread for good.
const ANSWER_GRACE: Duration = Duration::from_secs(10);

/// A connection to the supervisor, with deadlines for the request, and only to a supervisor of
/// the helper's own uid: a command that bound the name first (one can, where the supervisor did
/// not start) must not answer for it.
fn connect(name: &str, req: &ProcRequest) -> io::Result<UnixStream> {
    let conn = UnixStream::connect_addr(&abstract_addr(name)?)?;
    let peer = rustix::net::sockopt::socket_peercred(&conn)?;
    if !identity::trusted_peer(peer.uid.as_raw()) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the socket is held by uid {}, not the helper",
                peer.uid.as_raw()
            ),
        ));
    }
    let waits = match req {
        ProcRequest::Poll { wait_ms, .. } => Duration::from_millis(*wait_ms).min(MAX_WAIT),
        ProcRequest::Stdin { .. } => STDIN_WAIT,
        _ => Duration::ZERO,
    };
    conn.set_read_timeout(Some(waits + ANSWER_GRACE))?;
    conn.set_write_timeout(Some(ANSWER_GRACE))?;
    Ok(conn)
}

/// The client side, used by `serve`: one request to the supervisor; returns the DATA frame's
/// bytes (poll output, may be empty) and the response.
pub fn call(name: &str, req: &ProcRequest, data: Option<&[u8]>) -> (Vec<u8>, Response) {
    let unavailable = |e: io::Error| {
        Response::error(
            ErrorKind::Io,
            format!("the session's process supervisor does not answer: {e}"),
        )
    };
    let mut conn = match connect(name, req) {
        Ok(c) => c,
        Err(e) => return (Vec::new(), unavailable(e)),
    };
    let mut msg = Vec::new();
    encode_json(0, kind::REQUEST, req, &mut msg);
    if let Some(d) = data {
        encode(0, kind::DATA, d, &mut msg);
    }
    if let Err(e) = conn.write_all(&msg) {
        return (Vec::new(), unavailable(e));
    }
    let mut output = Vec::new();
    loop {
        match read_frame(&mut conn) {
            Ok(Some(f)) if f.kind == kind::DATA => output = f.payload,
            Ok(Some(f)) if f.kind == kind::RESPONSE => {
                return match serde_json::from_slice(&f.payload) {
                    Ok(r) => (output, r),
                    Err(e) => (
                        Vec::new(),
                        Response::error(ErrorKind::Internal, format!("bad supervisor answer: {e}")),
                    ),
                };
            }
            Ok(Some(_)) => {}
            Ok(None) => {
                return (
                    Vec::new(),
                    unavailable(io::Error::other("it closed the connection")),
                );
            }
            Err(e) => return (Vec::new(), unavailable(io::Error::other(e.to_string()))),
        }
    }
}
