//! The supervisor: `init`'s side of background processes. It starts them (as the sandbox user,
//! each in its own process group), keeps a bounded buffer of each one's output, and answers
//! `serve`'s requests on its socket, one connection per request.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{ChildStdin, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, PidfdFlags, Signal};
use sandbox_protocol::frame::{encode, encode_json, kind, read_frame};
use sandbox_protocol::layout;
use sandbox_protocol::message::{
    ErrorKind, PollInfo, ProcInfo, ProcList, ProcRequest, ProcStarted, Response, Usage,
};

use super::{MAX_WAIT, STDIN_WAIT, abstract_addr};
use crate::env_file::claimed_env;
use crate::identity::Identity;
use crate::ops::run::shell;
use crate::usage::{Meter, SAMPLE_EVERY, exited};

/// What the supervisor is told when `init` starts it.
#[derive(Debug, Clone)]
pub struct Config {
    /// The abstract socket it answers on (one per sandbox: per network namespace).
    pub socket: String,
    /// The claim's environment, read at each start (the claim writes it after `init` started).
    pub env_file: PathBuf,
    /// Who the supervisor is; processes run as its sandbox user, and only its own uid is served.
    pub identity: Identity,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            socket: layout::PROCESSES_SOCKET.to_string(),
            env_file: PathBuf::from(layout::ENV_FILE),
            identity: Identity::Inherited,
        }
    }
}

/// Finished processes kept for their exit code and output; older ones are forgotten first.
const KEEP_FINISHED: usize = 32;

struct Output {
    buf: VecDeque<u8>,
    cap: usize,
    /// Bytes ever written; `total - buf.len()` is the offset of `buf[0]`.
    total: u64,
    exit_code: Option<i64>,
    /// Once it ended: what it cost.
    usage: Usage,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Supervises the container's background processes (`init`, the keep-alive, runs it). Returns
/// only if the socket cannot be bound (then the caller just parks: commands still work).
pub fn supervise(config: Config) -> io::Result<()> {
    let listener = UnixListener::bind_addr(&abstract_addr(&config.socket)?)?;
    let config = Arc::new(config);
    let table = Arc::new(Mutex::new(Table::default()));
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        // Only `serve` (the helper's own uid) may start, list or kill processes: a command that
        // could would make work the reaper counts as use, past the per-session limit.
        match rustix::net::sockopt::socket_peercred(&conn) {
            Ok(peer) if config.identity.trusts_peer(peer.uid.as_raw()) => {}
            _ => continue,
        }
        let (config, table) = (config.clone(), table.clone());
        let _ = std::thread::Builder::new()
            .name("proc-conn".into())
            .spawn(move || {
                let _ = serve_conn(conn, &config, &table);
            });
    }
    Ok(())
}

fn serve_conn(mut conn: UnixStream, config: &Config, table: &Mutex<Table>) -> io::Result<()> {
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
        Ok(req) => handle(config, table, req),
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
    let (exit_code, usage) = {
        let o = lock(&p.out);
        (o.exit_code, o.usage)
    };
    ProcInfo {
        process_id: p.id.clone(),
        command: p.command.clone(),
        running: exit_code.is_none(),
        exit_code,
        usage,
    }
}

fn handle(config: &Config, table: &Mutex<Table>, req: ProcRequest) -> Response {
    match req {
        ProcRequest::Start {
            command,
            workdir,
            env,
            max_live,
            buffer_bytes,
        } => match start(
            config,
            table,
            command,
            &workdir,
            &env,
            max_live,
            buffer_bytes,
        ) {
            Ok(process_id) => Response::ok(&ProcStarted { process_id }),
            Err(r) => r,
        },
        ProcRequest::List => {
            let mut procs: Vec<Arc<Proc>> = lock(table).procs.values().cloned().collect();
            procs.sort_by_key(|p| p.seq);
            let processes = procs.iter().map(|p| info(p)).collect();
            Response::ok(&ProcList { processes })
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
    config: &Config,
    table: &Mutex<Table>,
    command: String,
    workdir: &str,
    env: &[(String, String)],
    max_live: u32,
    buffer_bytes: u64,
) -> Result<String, Response> {
    let Some((program, flags)) = shell(&config.identity).argv() else {
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
        let mut cmd = config.identity.sandbox_command(program);
        cmd.args(flags)
            .arg(&command)
            .stdin(Stdio::piped())
            .stdout(writer.try_clone().map_err(spawn_err)?)
            .stderr(writer)
            .current_dir(workdir)
            // Read at each start: the claim writes it after this supervisor started.
            .envs(claimed_env(&config.env_file))
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
            usage: Usage::default(),
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
            // Sampled while it runs; measured before it is reaped.
            let pid = i32::try_from(child.id()).unwrap_or(0);
            let mut meter = Meter::start(pid);
            let pidfd = Pid::from_raw(pid)
                .and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()).ok());
            loop {
                meter.sample();
                if exited(pid, pidfd.is_none()) {
                    break;
                }
                if let Some(fd) = &pidfd {
                    let every = SAMPLE_EVERY;
                    let ts = Timespec {
                        tv_sec: every.as_secs() as _,
                        tv_nsec: every.subsec_nanos() as _,
                    };
                    let mut fds = [PollFd::new(fd, PollFlags::IN)];
                    let _ = rustix::event::poll(&mut fds, Some(&ts));
                }
            }
            let usage = meter.finish(pid);
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
            o.usage = usage;
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
        usage: o.usage,
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
