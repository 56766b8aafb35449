//! `run`: a request's commands in order, each in its own process group with stdout and stderr in
//! one pipe (their interleaving exactly as written), or two when the request splits them, output
//! streamed as it is produced.
//!
//! Waiting is a `poll` on the pipe and, where the kernel has it, a pidfd of the shell, so a
//! command's end is seen at once even when a background child keeps the pipe open: once the
//! shell has exited, what is already in the pipe is taken without blocking and the command is
//! done. Timeouts and CANCEL kill the whole process group.

use std::io::{self, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, PidfdFlags, Signal};

use sandbox_protocol::frame::MAX_DATA_CHUNK;
use sandbox_protocol::message::{Event, Usage};

use super::{Halt, Stop, TICK};
use crate::identity::Identity;
use crate::usage::{Meter, exited};

/// Printed as a command's output when the image has no shell at all.
pub const NO_SHELL: &[u8] = b"daiv-sandbox: no shell in this image\n";
/// Exit code of a command killed by its timeout (as coreutils' `timeout`).
pub const TIMEOUT_EXIT: i64 = 124;
/// PATH used when the helper's own environment has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Most bytes taken from the pipe after the shell exited (a background child may keep writing).
const DRAIN_MAX: usize = 16 * 1024 * 1024;
/// Appended to the output of a command the kernel's OOM killer ended.
pub const OOM_NOTE: &[u8] =
    b"\n[daiv-sandbox: killed by the out-of-memory killer: the session's memory limit was reached]\n";

/// OOM kills so far in the container's memory cgroup (v2 `memory.events`, v1 `oom_control`),
/// `None` where neither is readable (gVisor, no memory controller).
fn oom_kills() -> Option<u64> {
    [
        "/sys/fs/cgroup/memory.events",
        "/sys/fs/cgroup/memory/memory.oom_control",
    ]
    .iter()
    .find_map(|p| {
        let text = std::fs::read_to_string(p).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
    })
}

/// What a `run` sends while it works.
pub enum Emit<'a> {
    Event(Event),
    /// Output: stdout, or both streams when they share a pipe.
    Data(&'a [u8]),
    /// stderr, when the run splits the streams.
    Stderr(&'a [u8]),
}

/// What one `run` request asks for.
pub struct RunSpec<'a> {
    pub commands: &'a [String],
    pub fail_fast: bool,
    pub timeout: Option<Duration>,
    pub output_cap: u64,
    pub workdir: &'a Path,
    pub env: &'a [(String, String)],
    /// stdout and stderr in pipes of their own.
    pub split: bool,
    /// Whom the commands run as.
    pub identity: &'a Identity,
}

/// The shell commands run with, picked once per process.
#[derive(Debug, Clone)]
pub enum Shell {
    /// `bash -o pipefail -c`.
    Bash(PathBuf),
    /// `sh -o pipefail -c` (busybox, bash as sh).
    ShPipefail(PathBuf),
    /// `sh -c` (dash).
    Sh(PathBuf),
    None,
}

impl Shell {
    /// The program and the flags that come before the command string.
    pub fn argv(&self) -> Option<(&Path, &'static [&'static str])> {
        match self {
            Shell::Bash(p) | Shell::ShPipefail(p) => Some((p, &["-o", "pipefail", "-c"])),
            Shell::Sh(p) => Some((p, &["-c"])),
            Shell::None => None,
        }
    }
}

/// `name` as an executable regular file on the helper's PATH.
fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The shell, detected on first use: bash if on PATH, else `sh` with pipefail if it accepts it
/// (tried as whom commands run as: one identity per process).
pub fn shell(identity: &Identity) -> &'static Shell {
    static SHELL: OnceLock<Shell> = OnceLock::new();
    SHELL.get_or_init(|| {
        if let Some(bash) = find_on_path("bash") {
            return Shell::Bash(bash);
        }
        let Some(sh) = find_on_path("sh") else {
            return Shell::None;
        };
        // As the sandbox user, as every shell the helper starts.
        let pipefail = identity
            .sandbox_command(&sh)
            .args(["-o", "pipefail", "-c", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if pipefail {
            Shell::ShPipefail(sh)
        } else {
            Shell::Sh(sh)
        }
    })
}

/// Finds the shell (see [`shell`]) and starts it once, so that the first command finds it
/// found and its binary warm: a new container's first exec of it reads it through the engine's
/// storage (`sh` was started by its probe already).
pub fn warm_shell(identity: &Identity) {
    if let Shell::Bash(program) = shell(identity) {
        let _ = identity
            .sandbox_command(program)
            .args(["-c", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// How one command ended.
#[derive(Clone, Copy)]
struct Outcome {
    exit_code: i64,
    omitted: u64,
    timed_out: bool,
    usage: Usage,
}

/// Sends output within the cap, counts the rest.
struct Capped<'e> {
    emit: &'e mut dyn FnMut(Emit<'_>),
    room: u64,
    omitted: u64,
}

impl Capped<'_> {
    fn push(&mut self, data: &[u8], stderr: bool) {
        let take = (data.len() as u64).min(self.room) as usize;
        for chunk in data[..take].chunks(MAX_DATA_CHUNK) {
            (self.emit)(if stderr {
                Emit::Stderr(chunk)
            } else {
                Emit::Data(chunk)
            });
        }
        self.room -= take as u64;
        self.omitted += (data.len() - take) as u64;
    }
}

/// Runs the commands; `pgid` holds the running command's process group (0 between commands) so
/// the server can kill it on shutdown. Only a CANCEL makes this an `Err`.
pub fn run(
    spec: &RunSpec<'_>,
    stop: &Stop<'_>,
    pgid: &AtomicI32,
    emit: &mut dyn FnMut(Emit<'_>),
) -> Result<(), RunError> {
    for (index, command) in spec.commands.iter().enumerate() {
        stop.check().map_err(RunError::Halt)?;
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        emit(Emit::Event(Event::Started { index }));
        let outcome = run_one(spec, command, stop, pgid, emit)?;
        emit(Emit::Event(Event::Finished {
            index,
            exit_code: outcome.exit_code,
            omitted: outcome.omitted,
            timed_out: outcome.timed_out,
            usage: outcome.usage,
        }));
        if outcome.timed_out || (spec.fail_fast && outcome.exit_code != 0) {
            break;
        }
    }
    Ok(())
}

#[derive(Debug)]
pub enum RunError {
    Halt(Halt),
    /// The shell could not be started (workdir missing, ...).
    Spawn(String),
}

fn exit_code(status: std::process::ExitStatus) -> i64 {
    match (status.code(), status.signal()) {
        (Some(c), _) => i64::from(c),
        (None, Some(s)) => 128 + i64::from(s),
        (None, None) => -1,
    }
}

fn kill_group(pid: u32) {
    if let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process_group(p, Signal::KILL);
    }
}

fn run_one(
    spec: &RunSpec<'_>,
    command: &str,
    stop: &Stop<'_>,
    pgid: &AtomicI32,
    emit: &mut dyn FnMut(Emit<'_>),
) -> Result<Outcome, RunError> {
    let mut out = Capped {
        emit,
        room: spec.output_cap,
        omitted: 0,
    };
    let Some((program, flags)) = shell(spec.identity).argv() else {
        out.push(NO_SHELL, spec.split);
        return Ok(Outcome {
            exit_code: 127,
            omitted: out.omitted,
            timed_out: false,
            usage: Usage::default(),
        });
    };
    let spawn_err = |e: io::Error| {
        RunError::Spawn(format!(
            "cannot start {} in {}: {e}",
            program.display(),
            spec.workdir.display()
        ))
    };
    let (reader, writer) = io::pipe().map_err(spawn_err)?;
    let (err_reader, err_writer) = if spec.split {
        let (r, w) = io::pipe().map_err(spawn_err)?;
        (Some(r), w)
    } else {
        (None, writer.try_clone().map_err(spawn_err)?)
    };
    let child = {
        let mut cmd = spec.identity.sandbox_command(program);
        cmd.args(flags)
            .arg(command)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(err_writer)
            .current_dir(spec.workdir)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .process_group(0);
        cmd.spawn().map_err(spawn_err)?
        // `cmd` drops here, closing our copies of the pipe's write end.
    };
    let pid = child.id();
    pgid.store(i32::try_from(pid).unwrap_or(0), Ordering::Relaxed);
    let ooms_before = oom_kills();
    let mut pipes = vec![Pipe::new(reader, false)];
    pipes.extend(err_reader.map(|r| Pipe::new(r, true)));
    let result = wait(child, &mut pipes, spec, stop, &mut out);
    pgid.store(0, Ordering::Relaxed);
    // SIGKILL with a new OOM kill in the cgroup: say so, or "137" is all the agent sees.
    if let Ok(o) = &result
        && o.exit_code == 128 + 9
        && !o.timed_out
        && let (Some(before), Some(after)) = (ooms_before, oom_kills())
        && after > before
    {
        out.push(OOM_NOTE, false);
        return Ok(Outcome {
            omitted: out.omitted,
            ..*o
        });
    }
    result
}

/// One of a command's output pipes.
struct Pipe {
    reader: io::PipeReader,
    stderr: bool,
    open: bool,
}

impl Pipe {
    fn new(reader: io::PipeReader, stderr: bool) -> Self {
        Self {
            reader,
            stderr,
            open: true,
        }
    }

    /// One read of what is there; the end or an error closes it.
    fn take(&mut self, buf: &mut [u8], out: &mut Capped<'_>) -> usize {
        match self.reader.read(buf) {
            Ok(0) => {
                self.open = false;
                0
            }
            Ok(n) => {
                out.push(&buf[..n], self.stderr);
                n
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(_) => {
                self.open = false;
                0
            }
        }
    }
}

fn wait(
    mut child: Child,
    pipes: &mut [Pipe],
    spec: &RunSpec<'_>,
    stop: &Stop<'_>,
    out: &mut Capped<'_>,
) -> Result<Outcome, RunError> {
    let pid = child.id();
    let pidfd = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()).ok());
    let deadline = spec.timeout.map(|t| Instant::now() + t);
    let mut buf = vec![0u8; MAX_DATA_CHUNK];
    let raw_pid = i32::try_from(pid).unwrap_or(0);
    let mut meter = Meter::start(raw_pid);
    loop {
        // First right after the spawn (which returns once the shell was exec'd), so even a
        // command that ends at once has a figure.
        meter.sample();
        // Exited but not yet reaped: its usage is still readable.
        if exited(raw_pid, false) {
            let usage = meter.finish(raw_pid);
            let code = child.wait().map_or(-1, exit_code);
            drain(pipes, &mut buf, out);
            return Ok(Outcome {
                exit_code: code,
                omitted: out.omitted,
                timed_out: false,
                usage,
            });
        }
        if stop.check().is_err() {
            kill_group(pid);
            let _ = child.wait();
            return Err(RunError::Halt(Halt::Cancelled));
        }
        let now = Instant::now();
        if let Some(d) = deadline
            && now >= d
        {
            kill_group(pid);
            exited(raw_pid, true);
            let usage = meter.finish(raw_pid);
            let _ = child.wait();
            drain(pipes, &mut buf, out);
            return Ok(Outcome {
                exit_code: TIMEOUT_EXIT,
                omitted: out.omitted,
                timed_out: true,
                usage,
            });
        }
        let wait_for = deadline.map_or(TICK, |d| TICK.min(d - now));
        let ts = Timespec {
            tv_sec: wait_for.as_secs() as _,
            tv_nsec: wait_for.subsec_nanos() as _,
        };
        let mut readable = [false; 2];
        {
            let open: Vec<usize> = (0..pipes.len()).filter(|&i| pipes[i].open).collect();
            let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(3);
            for &i in &open {
                fds.push(PollFd::new(&pipes[i].reader, PollFlags::IN));
            }
            if let Some(p) = &pidfd {
                fds.push(PollFd::new(p, PollFlags::IN));
            }
            if fds.is_empty() {
                std::thread::sleep(wait_for);
            } else if rustix::event::poll(&mut fds, Some(&ts)).is_ok() {
                for (k, &i) in open.iter().enumerate() {
                    readable[i] = !fds[k].revents().is_empty();
                }
            }
        }
        for (i, pipe) in pipes.iter_mut().enumerate() {
            if readable[i] {
                pipe.take(&mut buf, out);
            }
        }
    }
}

/// Takes what is already in the pipes without waiting for writers that outlive the shell.
fn drain(pipes: &mut [Pipe], buf: &mut [u8], out: &mut Capped<'_>) {
    for pipe in pipes {
        if !pipe.open || rustix::io::ioctl_fionbio(&pipe.reader, true).is_err() {
            continue;
        }
        let mut taken = 0;
        while taken < DRAIN_MAX && pipe.open {
            match pipe.reader.read(buf) {
                Ok(0) => pipe.open = false,
                Ok(n) => {
                    taken += n;
                    out.push(&buf[..n], pipe.stderr);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => pipe.open = false,
            }
        }
    }
}
