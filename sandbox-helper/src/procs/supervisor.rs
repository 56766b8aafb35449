//! The supervisor: `init`'s side of background processes. It starts them (as the sandbox user,
//! each in its own process group), keeps a bounded buffer of each one's output, and answers
//! `serve`'s requests on its socket, one connection per request.
//!
//! A process's output is one byte buffer (stdout and stderr in the order they were read, which
//! `poll` reads by offset) and, over it, the events of protocol 4: `start` (seq 1), one
//! `stdout`/`stderr` event per read of a pipe, `end`. An event is kept while all its bytes are in
//! the buffer (and at most [`max_events`] of them): older ones are gone, and asking after them
//! is `gone`, never a silent gap.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fd::OwnedFd;
use rustix::process::{Pid, PidfdFlags, Signal};
use sandbox_protocol::frame::{encode, encode_json, kind, read_frame};
use sandbox_protocol::layout;
use sandbox_protocol::message::{
    ErrorKind, PROCESS_ID_MAX, PollInfo, ProcEvent, ProcEvents, ProcInfo, ProcList, ProcRequest,
    ProcStarted, PtySize, Response, SIGNALS, Usage, valid_process_id,
};
use sandbox_protocol::text::incomplete_tail;

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
    /// The caller's environment, read at each start (a claim writes it after `init` started).
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

/// Output events kept per process at most: bounds their bookkeeping (32 bytes each) for a
/// process that writes a byte at a time.
fn max_events(cap: usize) -> usize {
    (cap / 128).max(1024)
}

/// One output event: `len` bytes of one stream at `offset` of the buffer's byte stream.
#[derive(Clone, Copy)]
struct Chunk {
    seq: u64,
    offset: u64,
    len: u32,
    stderr: bool,
}

struct Output {
    buf: VecDeque<u8>,
    cap: usize,
    /// Bytes ever written; `total - buf.len()` is the offset of `buf[0]`.
    total: u64,
    /// Output events whose bytes are all in `buf`, oldest first.
    chunks: VecDeque<Chunk>,
    /// The next event's seq (1 is `start`).
    next_seq: u64,
    /// The oldest output event still kept (`next_seq` when none is): the ones from 2 up to it
    /// are gone.
    first_kept: u64,
    exit_code: Option<i64>,
    /// The signal that ended it.
    signal: Option<i32>,
    /// Once it ended: what it cost.
    usage: Usage,
    /// Output pipes not yet at their end.
    pipes_open: u8,
}

impl Output {
    /// `pipes`: the output pipes to read to their end (2; 1 for a terminal).
    fn new(cap: usize, pipes: u8) -> Self {
        Self {
            buf: VecDeque::new(),
            cap,
            total: 0,
            chunks: VecDeque::new(),
            next_seq: 2,
            first_kept: 2,
            exit_code: None,
            signal: None,
            usage: Usage::default(),
            pipes_open: pipes,
        }
    }

    /// Takes one read of a pipe: its bytes, and an event over them.
    fn push(&mut self, data: &[u8], stderr: bool) {
        if data.is_empty() {
            return;
        }
        self.chunks.push_back(Chunk {
            seq: self.next_seq,
            offset: self.total,
            len: u32::try_from(data.len()).unwrap_or(u32::MAX),
            stderr,
        });
        self.next_seq += 1;
        self.total += data.len() as u64;
        self.buf.extend(data);
        let excess = self.buf.len().saturating_sub(self.cap);
        self.buf.drain(..excess);
        let first = self.total - self.buf.len() as u64;
        let most = max_events(self.cap);
        while let Some(c) = self.chunks.front() {
            if c.offset < first || self.chunks.len() > most {
                self.chunks.pop_front();
            } else {
                break;
            }
        }
        self.first_kept = self.chunks.front().map_or(self.next_seq, |c| c.seq);
    }

    /// The newest event's seq: `end`'s once it ended.
    fn last_seq(&self) -> u64 {
        if self.exit_code.is_some() {
            self.next_seq
        } else {
            self.next_seq - 1
        }
    }
}

struct Proc {
    id: String,
    command: String,
    tag: Option<String>,
    pgid: i32,
    /// Its stdin: a pipe, or its terminal's controlling side.
    stdin: Mutex<Option<File>>,
    /// Its terminal's controlling side, when it was started in one (to set its size).
    pty: Option<File>,
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
        Ok(ProcRequest::Events {
            process_id,
            after,
            wait_ms,
            max_bytes,
        }) => match events(table, &process_id, after, wait_ms, max_bytes) {
            Ok((answer, data)) => {
                encode(0, kind::DATA, &data, &mut reply);
                Response::ok(&answer)
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
        pid: u32::try_from(p.pgid).ok().filter(|&p| p > 0),
        tag: p.tag.clone(),
        pty: p.pty.is_some(),
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
            process_id,
            tag,
            pty,
        } => {
            let ask = Start {
                command,
                workdir: &workdir,
                env: &env,
                max_live,
                buffer_bytes,
                id: process_id,
                tag,
                pty,
            };
            match start(config, table, ask) {
                Ok(started) => Response::ok(&started),
                Err(r) => r,
            }
        }
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
        ProcRequest::Signal { process_id, signal } => {
            let Some(sig) = signal_named(&signal) else {
                return Response::error(
                    ErrorKind::BadRequest,
                    format!("signal must be one of {SIGNALS:?}, got {signal:?}"),
                );
            };
            match find(table, &process_id) {
                Ok(p) => {
                    if lock(&p.out).exit_code.is_some() {
                        return Response::error(ErrorKind::Conflict, "the process has ended");
                    }
                    if let Some(pid) = Pid::from_raw(p.pgid) {
                        let _ = rustix::process::kill_process_group(pid, sig);
                    }
                    Response::empty()
                }
                Err(r) => r,
            }
        }
        ProcRequest::Resize { process_id, size } => match find(table, &process_id) {
            Ok(p) => {
                if lock(&p.out).exit_code.is_some() {
                    return Response::error(ErrorKind::Conflict, "the process has ended");
                }
                let Some(master) = &p.pty else {
                    return Response::error(
                        ErrorKind::Conflict,
                        "the process was not started in a terminal",
                    );
                };
                match super::pty::resize(master, size) {
                    Ok(()) => Response::empty(),
                    Err(e) => Response::error(ErrorKind::Io, format!("cannot resize: {e}")),
                }
            }
            Err(r) => r,
        },
        ProcRequest::Poll { .. } | ProcRequest::Stdin { .. } | ProcRequest::Events { .. } => {
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

/// A signal a client may send, by its name.
fn signal_named(name: &str) -> Option<Signal> {
    match name {
        "TERM" => Some(Signal::TERM),
        "KILL" => Some(Signal::KILL),
        "INT" => Some(Signal::INT),
        "HUP" => Some(Signal::HUP),
        _ => None,
    }
}

/// The name of signal `n` (Linux numbering), as an `end` event says it.
fn signal_name(n: i32) -> String {
    const NAMES: [&str; 31] = [
        "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "KILL", "USR1", "SEGV", "USR2",
        "PIPE", "ALRM", "TERM", "STKFLT", "CHLD", "CONT", "STOP", "TSTP", "TTIN", "TTOU", "URG",
        "XCPU", "XFSZ", "VTALRM", "PROF", "WINCH", "IO", "PWR", "SYS",
    ];
    usize::try_from(n - 1)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("SIG{n}"), |s| (*s).to_string())
}

/// What a start asks for.
struct Start<'a> {
    command: String,
    workdir: &'a str,
    env: &'a [(String, String)],
    max_live: u32,
    buffer_bytes: u64,
    /// The client's id, if it chose one.
    id: Option<String>,
    tag: Option<String>,
    /// In a terminal of this size.
    pty: Option<PtySize>,
}

fn start(config: &Config, table: &Mutex<Table>, ask: Start<'_>) -> Result<ProcStarted, Response> {
    let Start {
        command,
        workdir,
        env,
        max_live,
        buffer_bytes,
        id: wanted,
        tag,
        pty,
    } = ask;
    let Some((program, flags)) = shell(&config.identity).argv() else {
        return Err(Response::error(
            ErrorKind::Io,
            "this image has no shell to run a process with",
        ));
    };
    let mut t = lock(table);
    if let Some(id) = &wanted {
        if !valid_process_id(id) {
            return Err(Response::error(
                ErrorKind::BadRequest,
                format!(
                    "process id {id:?} is not 1 to {PROCESS_ID_MAX} of [A-Za-z0-9._-], not starting with a dot"
                ),
            ));
        }
        if let Some(p) = t.procs.get(id) {
            // The same start again (a client retrying): the same process.
            if p.command == command {
                return Ok(ProcStarted {
                    process_id: id.clone(),
                    existing: true,
                });
            }
            return Err(Response::error(
                ErrorKind::Conflict,
                format!("process id {id:?} is taken by another command"),
            ));
        }
    }
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
    // Its output: two pipes, or its terminal (one stream, as a terminal shows it).
    let (readers, master, mut child) = match pty {
        None => {
            let (out_reader, out_writer) = io::pipe().map_err(spawn_err)?;
            let (err_reader, err_writer) = io::pipe().map_err(spawn_err)?;
            let mut cmd = config.identity.sandbox_command(program);
            cmd.args(flags)
                .arg(&command)
                .stdin(Stdio::piped())
                .stdout(out_writer)
                .stderr(err_writer)
                .current_dir(workdir)
                // Read at each start: the claim writes it after this supervisor started.
                .envs(claimed_env(&config.env_file))
                .envs(env.iter().map(|(k, v)| (k, v)))
                .process_group(0);
            let child = cmd.spawn().map_err(spawn_err)?;
            let readers = vec![
                (File::from(OwnedFd::from(out_reader)), false),
                (File::from(OwnedFd::from(err_reader)), true),
            ];
            (readers, None, child)
        }
        Some(size) => {
            let (master, slave) = super::pty::open(size).map_err(spawn_err)?;
            // `pty-exec` makes it a session leader with the terminal as its controlling one.
            let helper = std::env::current_exe().map_err(spawn_err)?;
            let mut cmd = config.identity.sandbox_command(helper);
            cmd.args(["pty-exec", "--"])
                .arg(program)
                .args(flags)
                .arg(&command)
                .stdin(slave.try_clone().map_err(spawn_err)?)
                .stdout(slave.try_clone().map_err(spawn_err)?)
                .stderr(slave)
                .current_dir(workdir)
                .env("TERM", "xterm-256color")
                .envs(claimed_env(&config.env_file))
                .envs(env.iter().map(|(k, v)| (k, v)));
            let child = cmd.spawn().map_err(spawn_err)?;
            let readers = vec![(master.try_clone().map_err(spawn_err)?, false)];
            (readers, Some(master), child)
        }
    };
    t.next += 1;
    let seq = t.next;
    let id = wanted.unwrap_or_else(|| format!("p{seq}-{}", random_hex()));
    let stdin = match &master {
        Some(m) => m.try_clone().ok(),
        None => child.stdin.take().map(|s| File::from(OwnedFd::from(s))),
    };
    let pipes = u8::try_from(readers.len()).unwrap_or(2);
    let proc = Arc::new(Proc {
        id: id.clone(),
        command,
        tag,
        pgid: i32::try_from(child.id()).unwrap_or(0),
        stdin: Mutex::new(stdin),
        pty: master,
        out: Mutex::new(Output::new(
            usize::try_from(buffer_bytes.max(1)).unwrap_or(usize::MAX),
            pipes,
        )),
        changed: Condvar::new(),
        seq,
    });
    t.procs.insert(id.clone(), proc.clone());
    forget_old(&mut t);
    drop(t);

    for (reader, stderr) in readers {
        read_pipe(proc.clone(), reader, stderr);
    }
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
                if exited(pid, false) {
                    break;
                }
                // Without a pidfd (gVisor's older releases have none) the wait is a sleep: a
                // blocking wait would take no sample between the first and the last.
                match &pidfd {
                    Some(fd) => {
                        let every = SAMPLE_EVERY;
                        let ts = Timespec {
                            tv_sec: every.as_secs() as _,
                            tv_nsec: every.subsec_nanos() as _,
                        };
                        let mut fds = [PollFd::new(fd, PollFlags::IN)];
                        let _ = rustix::event::poll(&mut fds, Some(&ts));
                    }
                    None => std::thread::sleep(SAMPLE_EVERY),
                }
            }
            let usage = meter.finish(pid);
            let status = child.wait();
            let signal = status.as_ref().ok().and_then(|s| s.signal());
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
            while o.pipes_open > 0 {
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
            o.signal = signal;
            o.usage = usage;
            drop(o);
            *lock(&p.stdin) = None;
            p.changed.notify_all();
        });
    Ok(ProcStarted {
        process_id: id,
        existing: false,
    })
}

/// Reads one of a process's output pipes (or its terminal) into its buffer until it ends (a
/// terminal whose last process closed it answers EIO). A character cut at the end of a read
/// waits for the rest, so each event's bytes are whole characters.
fn read_pipe(p: Arc<Proc>, mut reader: File, stderr: bool) {
    let _ = std::thread::Builder::new()
        .name("proc-out".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            let mut held = 0usize;
            loop {
                match reader.read(&mut buf[held..]) {
                    Ok(0) => break,
                    Ok(n) => {
                        let have = held + n;
                        // At most 3 bytes are held (an incomplete character), so a read always
                        // has room.
                        let cut = incomplete_tail(&buf[..have]);
                        lock(&p.out).push(&buf[..have - cut], stderr);
                        buf.copy_within(have - cut..have, 0);
                        held = cut;
                        p.changed.notify_all();
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // A terminal's controlling side is shared with stdin writes, which make it
                    // non-blocking: wait for output then.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        let mut fds = [PollFd::new(&reader, PollFlags::IN)];
                        let ts = Timespec {
                            tv_sec: 1,
                            tv_nsec: 0,
                        };
                        let _ = rustix::event::poll(&mut fds, Some(&ts));
                    }
                    Err(_) => break,
                }
            }
            let mut o = lock(&p.out);
            o.push(&buf[..held], stderr);
            o.pipes_open = o.pipes_open.saturating_sub(1);
            drop(o);
            p.changed.notify_all();
        });
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

/// The events after `after` (all kept ones without it), waiting up to `wait_ms` while there is
/// none newer and the process runs; output events up to `max_bytes` (at least one).
fn events(
    table: &Mutex<Table>,
    id: &str,
    after: Option<u64>,
    wait_ms: u64,
    max_bytes: u64,
) -> Result<(ProcEvents, Vec<u8>), Response> {
    let p = find(table, id)?;
    let until = Instant::now() + Duration::from_millis(wait_ms).min(MAX_WAIT);
    let seen = after.unwrap_or(0);
    let mut o = lock(&p.out);
    while seen >= o.last_seq() && o.exit_code.is_none() {
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
    if after.is_some() && (seen + 1).max(2) < o.first_kept {
        return Err(Response::error(
            ErrorKind::Gone,
            format!(
                "the events after {seen} are no longer kept: the oldest output event kept is {}",
                o.first_kept
            ),
        ));
    }
    let mut list = Vec::new();
    let mut data = Vec::new();
    if seen == 0 {
        list.push(ProcEvent::Start {
            seq: 1,
            pid: u32::try_from(p.pgid).unwrap_or(0),
        });
    }
    let first = o.total - o.buf.len() as u64;
    let mut complete = true;
    for c in o.chunks.iter().filter(|c| c.seq > seen) {
        if !data.is_empty() && (data.len() + c.len as usize) as u64 > max_bytes {
            complete = false;
            break;
        }
        let from = usize::try_from(c.offset - first).unwrap_or(usize::MAX);
        data.extend(o.buf.range(from..from + c.len as usize));
        list.push(if c.stderr {
            ProcEvent::Stderr {
                seq: c.seq,
                len: c.len,
            }
        } else {
            ProcEvent::Stdout {
                seq: c.seq,
                len: c.len,
            }
        });
    }
    if let Some(exit_code) = o.exit_code
        && complete
        && o.next_seq > seen
    {
        list.push(ProcEvent::End {
            seq: o.next_seq,
            exit_code,
            signal: o.signal.map(signal_name),
            usage: o.usage,
        });
    }
    let answer = ProcEvents {
        events: list,
        last_seq: o.last_seq(),
    };
    Ok((answer, data))
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
fn write_within(pipe: &mut File, data: &[u8], limit: Duration) -> io::Result<()> {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn config() -> Config {
        Config {
            socket: "unused".into(),
            env_file: PathBuf::from("/nonexistent/environment"),
            identity: Identity::Inherited,
        }
    }

    fn launch(t: &Mutex<Table>, command: &str, id: Option<&str>, cap: u64) -> ProcStarted {
        let ask = Start {
            command: command.into(),
            workdir: "/",
            env: &[],
            max_live: 8,
            buffer_bytes: cap,
            id: id.map(Into::into),
            tag: Some("t".into()),
            pty: None,
        };
        start(&config(), t, ask).unwrap_or_else(|r| panic!("{r:?}"))
    }

    /// Events from `after` to the end, each output event with its bytes.
    fn until_end(t: &Mutex<Table>, id: &str, mut after: Option<u64>) -> Vec<(ProcEvent, Vec<u8>)> {
        let mut all = Vec::new();
        loop {
            let (answer, data) =
                events(t, id, after, 5_000, 1 << 20).unwrap_or_else(|r| panic!("{r:?}"));
            let mut rest = &data[..];
            let mut done = false;
            for e in answer.events {
                let len = match &e {
                    ProcEvent::Stdout { len, .. } | ProcEvent::Stderr { len, .. } => *len as usize,
                    ProcEvent::End { .. } => {
                        done = true;
                        0
                    }
                    ProcEvent::Start { .. } => 0,
                };
                after = Some(e.seq());
                all.push((e, rest[..len].to_vec()));
                rest = &rest[len..];
            }
            assert!(rest.is_empty());
            if done {
                return all;
            }
        }
    }

    fn text(events: &[(ProcEvent, Vec<u8>)], stderr: bool) -> String {
        events
            .iter()
            .filter(|(e, _)| match e {
                ProcEvent::Stdout { .. } => !stderr,
                ProcEvent::Stderr { .. } => stderr,
                _ => false,
            })
            .map(|(_, d)| String::from_utf8(d.clone()).unwrap())
            .collect()
    }

    #[test]
    fn events_keep_the_streams_apart_in_order_and_resume_without_a_gap() {
        let t = Mutex::new(Table::default());
        let p = launch(
            &t,
            "echo a; echo b >&2; sleep 0.1; echo c; exit 3",
            None,
            4096,
        );
        let all = until_end(&t, &p.process_id, None);
        let seqs: Vec<u64> = all.iter().map(|(e, _)| e.seq()).collect();
        assert_eq!(
            seqs,
            (1..=seqs.len() as u64).collect::<Vec<_>>(),
            "{seqs:?}"
        );
        assert!(matches!(all[0].0, ProcEvent::Start { seq: 1, pid } if pid > 0));
        assert_eq!(text(&all, false), "a\nc\n");
        assert_eq!(text(&all, true), "b\n");
        let Some((
            ProcEvent::End {
                exit_code,
                signal,
                usage,
                ..
            },
            _,
        )) = all.last()
        else {
            panic!("no end: {seqs:?}")
        };
        assert_eq!((*exit_code, signal.clone()), (3, None));
        assert!(usage.duration_ms.is_some());
        // Resumed after any event: exactly the ones after it.
        for k in 1..all.len() {
            let again = until_end(&t, &p.process_id, Some(k as u64));
            let want: Vec<u64> = seqs[k..].to_vec();
            assert_eq!(again.iter().map(|(e, _)| e.seq()).collect::<Vec<_>>(), want);
        }
    }

    #[test]
    fn events_that_left_the_buffer_are_gone_not_skipped() {
        let t = Mutex::new(Table::default());
        let p = launch(
            &t,
            "i=0; while [ $i -lt 300 ]; do echo line$i; i=$((i+1)); done",
            None,
            64,
        );
        while poll(&t, &p.process_id, 0, 5_000, 0)
            .unwrap()
            .0
            .exit_code
            .is_none()
        {}
        let all = until_end(&t, &p.process_id, None);
        // Without `after`: what is kept, from the start event on.
        assert!(matches!(all[0].0, ProcEvent::Start { .. }));
        let full: String = (0..300).map(|i| format!("line{i}\n")).collect();
        // Whole events only (one larger than the buffer is not kept), the newest ones.
        assert!(full.ends_with(&text(&all, false)));
        let r = events(&t, &p.process_id, Some(1), 0, 1 << 20);
        assert!(matches!(r, Err(Response::Error(e)) if e.kind == ErrorKind::Gone));
        // The poll by offset still reads the kept bytes.
        let (info, data) = poll(&t, &p.process_id, 0, 0, 1 << 20).unwrap();
        assert!(info.truncated && data.len() == 64, "{info:?}");
    }

    #[test]
    fn a_signal_ends_the_group_and_the_end_event_names_it() {
        let t = Mutex::new(Table::default());
        let p = launch(&t, "sleep 30; echo never", None, 4096);
        let refused = handle(
            &config(),
            &t,
            ProcRequest::Signal {
                process_id: p.process_id.clone(),
                signal: "STOP".into(),
            },
        );
        assert!(matches!(refused, Response::Error(e) if e.kind == ErrorKind::BadRequest));
        let sent = handle(
            &config(),
            &t,
            ProcRequest::Signal {
                process_id: p.process_id.clone(),
                signal: "TERM".into(),
            },
        );
        assert_eq!(sent, Response::empty());
        let all = until_end(&t, &p.process_id, None);
        let Some((
            ProcEvent::End {
                exit_code, signal, ..
            },
            _,
        )) = all.last()
        else {
            panic!("no end")
        };
        assert_eq!((*exit_code, signal.as_deref()), (143, Some("TERM")));
        let late = handle(
            &config(),
            &t,
            ProcRequest::Signal {
                process_id: p.process_id,
                signal: "KILL".into(),
            },
        );
        assert!(matches!(late, Response::Error(e) if e.kind == ErrorKind::Conflict));
    }

    #[test]
    fn a_clients_id_makes_a_start_idempotent() {
        let t = Mutex::new(Table::default());
        let first = launch(&t, "sleep 30", Some("dev-server"), 4096);
        assert_eq!(
            (first.process_id.as_str(), first.existing),
            ("dev-server", false)
        );
        let again = launch(&t, "sleep 30", Some("dev-server"), 4096);
        assert!(again.existing);
        let ask = |command: &str, id: &str| Start {
            command: command.into(),
            workdir: "/",
            env: &[],
            max_live: 8,
            buffer_bytes: 64,
            id: Some(id.into()),
            tag: None,
            pty: None,
        };
        let other = start(&config(), &t, ask("sleep 1", "dev-server"));
        assert!(matches!(other, Err(Response::Error(e)) if e.kind == ErrorKind::Conflict));
        for bad in ["", ".hidden", "a/b", "x y", &"a".repeat(65)] {
            let r = start(&config(), &t, ask("true", bad));
            assert!(
                matches!(r, Err(Response::Error(e)) if e.kind == ErrorKind::BadRequest),
                "{bad}"
            );
        }
        let listed = lock(&t).procs.values().map(|p| info(p)).collect::<Vec<_>>();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].tag.as_deref(), Some("t"));
        assert!(listed[0].pid.is_some());
        handle(
            &config(),
            &t,
            ProcRequest::Kill {
                process_id: "dev-server".into(),
            },
        );
    }

    #[test]
    fn a_character_cut_between_reads_comes_whole_in_one_event() {
        let t = Mutex::new(Table::default());
        let p = launch(&t, r"printf '\303'; sleep 0.3; printf '\251\n'", None, 4096);
        let all = until_end(&t, &p.process_id, None);
        let chunks: Vec<&Vec<u8>> = all
            .iter()
            .filter(|(e, _)| matches!(e, ProcEvent::Stdout { .. }))
            .map(|(_, d)| d)
            .collect();
        assert!(
            chunks.iter().all(|d| std::str::from_utf8(d).is_ok()),
            "{chunks:?}"
        );
        assert_eq!(text(&all, false), "é\n");
    }

    #[test]
    fn signals_are_named() {
        assert_eq!(signal_name(9), "KILL");
        assert_eq!(signal_name(15), "TERM");
        assert_eq!(signal_name(1), "HUP");
        assert_eq!(signal_name(64), "SIG64");
        assert_eq!(signal_name(0), "SIG0");
    }
}
