//! A context: one Jupyter kernel process, its working directory and its connections. One
//! execution runs at a time (the lock over [`Running`]); an interrupt or a restart reaches the
//! process without that lock.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use jupyter_protocol::{
    ConnectionInfo, ExecuteRequest, ExecutionState, JupyterMessage, JupyterMessageContent,
    KernelInfoRequest, ShutdownRequest, Transport,
};
use jupyter_zmq_client::{
    ClientControlConnection, ClientIoPubConnection, ClientShellConnection,
    create_client_control_connection, create_client_iopub_connection,
    create_client_shell_connection_with_identity, peek_ports_with_listeners,
    peer_identity_for_session,
};
use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::sync::{Mutex, mpsc};

/// Where an execution's lines go: unbounded, so a slow reader never stops the kernel's messages
/// from being read (the kernel drops IOPub messages past its high-water mark); what waits is the
/// sandbox's own memory.
pub type Lines = mpsc::UnboundedSender<Value>;

use crate::wire;

/// How long a kernel may take to answer its first `kernel_info_request`.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a quiet execution sends a `keepalive` line.
const KEEPALIVE: Duration = Duration::from_secs(20);
/// How long an interrupted execution may take to end before its kernel is restarted.
const INTERRUPT_GRACE: Duration = Duration::from_secs(10);

/// Run silently in a new Python kernel: the user's site directory exists and is on the path, so
/// a package that `pip install` puts there (as the sandbox user cannot write the system's) is
/// importable in the same kernel, as in a notebook.
/// Run again when `HOME` changes (a warm-pool claim): `site` caches the directory it computed.
const PYTHON_SETUP: &str = "import os as _o, site as _s\n_s.USER_BASE = _s.USER_SITE = None\n_o.makedirs(_s.getusersitepackages(), exist_ok=True)\n_s.addsitedir(_s.getusersitepackages())\ndel _o, _s\n";

/// The argv that starts `language`'s kernel with its connection file, if this server knows one.
fn kernel_argv(language: &str, connection_file: &str) -> Option<Vec<String>> {
    let module = match language {
        "python" => "ipykernel_launcher",
        "bash" => "bash_kernel",
        _ => return None,
    };
    Some(
        // -P: the working directory (a context's, the user's to fill) is not searched for the
        // launcher itself; the kernel adds it for the user's own imports.
        ["python3", "-P", "-m", module, "-f", connection_file]
            .map(String::from)
            .to_vec(),
    )
}

/// Whether this server can start a kernel for `language`.
pub fn known_language(language: &str) -> bool {
    kernel_argv(language, "").is_some()
}

pub struct Context {
    pub id: String,
    pub language: String,
    pub cwd: String,
    /// The kernel's pid (0 while none runs), for signals that must not wait for the lock.
    pid: AtomicI32,
    /// Deleted: no kernel starts again (an execution queued before the delete finds it closed).
    closed: AtomicBool,
    running: Mutex<Option<Running>>,
    /// Where connection files go (private to the sandbox user).
    runtime_dir: PathBuf,
}

struct Running {
    /// The caller's environment the kernel has (see [`Context::catch_up_env`]).
    env: BTreeMap<String, String>,
    child: Child,
    shell: ClientShellConnection,
    iopub: ClientIoPubConnection,
    control: ClientControlConnection,
    connection_file: PathBuf,
}

/// Why an execution could not run.
#[derive(Debug)]
pub enum ExecError {
    /// The kernel could not start.
    Start(String),
    /// The context was deleted.
    Closed,
}

impl std::fmt::Display for ExecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExecError::Start(why) => write!(f, "the kernel could not start: {why}"),
            ExecError::Closed => write!(f, "the context was deleted"),
        }
    }
}

/// The caller's environment: the session's environment file (a create's, or a warm-pool
/// claim's, written after this server started), read each time it is asked for.
fn caller_env() -> BTreeMap<String, String> {
    let Ok(bytes) = std::fs::read(sandbox_protocol::layout::ENV_FILE) else {
        return BTreeMap::new();
    };
    serde_json::from_slice::<Vec<(String, String)>>(&bytes)
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, v)| !k.is_empty() && !k.contains(['=', '\0']) && !v.contains('\0'))
        .collect()
}

/// The inline backend for matplotlib, so a figure is a PNG display.
const MPLBACKEND: (&str, &str) = ("MPLBACKEND", "module://matplotlib_inline.backend_inline");

impl Context {
    pub fn new(id: String, language: String, cwd: String, runtime_dir: PathBuf) -> Arc<Self> {
        Arc::new(Self {
            id,
            language,
            cwd,
            pid: AtomicI32::new(0),
            closed: AtomicBool::new(false),
            running: Mutex::new(None),
            runtime_dir,
        })
    }

    pub fn info(&self) -> wire::ContextInfo {
        wire::ContextInfo {
            id: self.id.clone(),
            language: self.language.clone(),
            cwd: self.cwd.clone(),
        }
    }

    /// Starts the kernel if none runs (or the one that ran has exited).
    pub async fn ensure_started(&self) -> Result<(), ExecError> {
        let mut guard = self.running.lock().await;
        self.ensure(&mut guard).await
    }

    async fn ensure(&self, slot: &mut Option<Running>) -> Result<(), ExecError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(ExecError::Closed);
        }
        if let Some(r) = slot.as_mut() {
            if matches!(r.child.try_wait(), Ok(None)) {
                return Ok(());
            }
            self.stop(slot).await;
        }
        let running = self.start().await.map_err(ExecError::Start)?;
        self.pid.store(
            running
                .child
                .id()
                .and_then(|p| i32::try_from(p).ok())
                .unwrap_or(0),
            Ordering::SeqCst,
        );
        *slot = Some(running);
        if self.language == "python" {
            let _ = self
                .run(slot, PYTHON_SETUP.to_string(), true, None, None)
                .await;
        }
        Ok(())
    }

    async fn start(&self) -> Result<Running, String> {
        let (ports, listeners) = peek_ports_with_listeners(IpAddr::V4(Ipv4Addr::LOCALHOST), 5)
            .await
            .map_err(|e| format!("no free ports: {e}"))?;
        let key = uuid::Uuid::new_v4().simple().to_string();
        let info = ConnectionInfo {
            ip: "127.0.0.1".into(),
            transport: Transport::TCP,
            shell_port: ports[0],
            iopub_port: ports[1],
            stdin_port: ports[2],
            control_port: ports[3],
            hb_port: ports[4],
            key,
            signature_scheme: "hmac-sha256".into(),
            kernel_name: Some(self.language.clone()),
        };
        let connection_file = self.runtime_dir.join(format!("kernel-{}.json", self.id));
        let json = serde_json::to_vec(&info).map_err(|e| e.to_string())?;
        write_private(&connection_file, &json).map_err(|e| format!("connection file: {e}"))?;
        let argv = kernel_argv(&self.language, &connection_file.to_string_lossy())
            .ok_or_else(|| format!("no kernel for language {:?}", self.language))?;
        drop(listeners); // the kernel binds them now
        let caller = caller_env();
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .current_dir(&self.cwd)
            .env(MPLBACKEND.0, MPLBACKEND.1)
            // ipykernel's parent poller: the kernel ends when this server does (its restart by
            // `init` then leaves no kernel behind).
            .env("JPY_PARENT_PID", std::process::id().to_string())
            .envs(&caller)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", argv.join(" ")))?;

        let session = uuid::Uuid::new_v4().to_string();
        let connect = async {
            let identity = peer_identity_for_session(&session).map_err(|e| e.to_string())?;
            let iopub = create_client_iopub_connection(&info, "", &session)
                .await
                .map_err(|e| e.to_string())?;
            let shell = create_client_shell_connection_with_identity(&info, &session, identity)
                .await
                .map_err(|e| e.to_string())?;
            let control = create_client_control_connection(&info, &session)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((iopub, shell, control))
        };
        let (mut iopub, mut shell, control) =
            tokio::time::timeout(START_TIMEOUT, connect)
                .await
                .map_err(|_| "the kernel's sockets did not answer".to_string())??;

        // Ready when it answers on shell and its IOPub reaches us (a subscription made before
        // the kernel bound may miss the first messages: ask until one arrives).
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("the kernel exited at start ({status})"));
            }
            if Instant::now() > deadline {
                return Err("the kernel did not answer within its start time".into());
            }
            shell
                .send(KernelInfoRequest {}.into())
                .await
                .map_err(|e| e.to_string())?;
            let seen = tokio::time::timeout(Duration::from_millis(500), iopub.read()).await;
            if matches!(seen, Ok(Ok(_))) {
                break;
            }
        }
        // Drain the kernel_info replies and their IOPub chatter.
        loop {
            let shell_more = tokio::time::timeout(Duration::from_millis(20), shell.read()).await;
            let iopub_more = tokio::time::timeout(Duration::from_millis(20), iopub.read()).await;
            if shell_more.is_err() && iopub_more.is_err() {
                break;
            }
        }
        Ok(Running {
            env: caller,
            child,
            shell,
            iopub,
            control,
            connection_file,
        })
    }

    async fn stop(&self, slot: &mut Option<Running>) {
        self.pid.store(0, Ordering::SeqCst);
        if let Some(mut r) = slot.take() {
            let _ = tokio::time::timeout(
                Duration::from_millis(500),
                r.control.send(ShutdownRequest { restart: false }.into()),
            )
            .await;
            if tokio::time::timeout(Duration::from_secs(1), r.child.wait())
                .await
                .is_err()
            {
                kill_group(&r.child, rustix::process::Signal::KILL);
                let _ = r.child.wait().await;
            }
            let _ = std::fs::remove_file(&r.connection_file);
        }
    }

    /// The caller's environment file as it is now, given to a kernel that started before it
    /// changed: a warm-pool member's kernels start before its claim writes the file.
    async fn catch_up_env(&self, slot: &mut Option<Running>) {
        let now = caller_env();
        let changed: BTreeMap<String, String> = {
            let Some(r) = slot.as_mut() else { return };
            if r.env == now {
                return;
            }
            let changed = now
                .iter()
                .filter(|(k, v)| r.env.get(*k) != Some(*v) && wire::valid_env_name(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            r.env = now;
            changed
        };
        if let Some((set, _)) = wire::env_code(&self.language, &changed) {
            let _ = self.run(slot, set, true, None, None).await;
            if self.language == "python" && changed.contains_key("HOME") {
                let _ = self
                    .run(slot, PYTHON_SETUP.to_string(), true, None, None)
                    .await;
            }
        }
    }

    /// Sends SIGINT to the kernel (its process group), as Jupyter's `interrupt_mode: signal`.
    pub fn interrupt(&self) {
        signal_pid(
            self.pid.load(Ordering::SeqCst),
            rustix::process::Signal::INT,
        );
    }

    /// Kills the kernel now (without waiting for a running execution) and starts a new one.
    pub async fn restart(&self) -> Result<(), ExecError> {
        signal_pid(
            self.pid.load(Ordering::SeqCst),
            rustix::process::Signal::KILL,
        );
        let mut guard = self.running.lock().await;
        self.stop(&mut guard).await;
        self.ensure(&mut guard).await
    }

    /// Stops the kernel for good.
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        signal_pid(
            self.pid.load(Ordering::SeqCst),
            rustix::process::Signal::KILL,
        );
        let mut guard = self.running.lock().await;
        self.stop(&mut guard).await;
    }

    /// Runs `code`, sending its lines to `out` as they come, and always ends with
    /// `end_of_execution` (unless `out` went away). `env` is set around it; `timeout` interrupts
    /// it. A caller that goes away interrupts it too: nothing keeps running for nobody.
    pub async fn execute(
        self: Arc<Self>,
        code: String,
        env: BTreeMap<String, String>,
        timeout: Option<Duration>,
        out: Lines,
    ) {
        let mut guard = self.running.lock().await;
        // A caller that went away while it waited its turn: nothing runs for nobody.
        if out.is_closed() {
            return;
        }
        if let Err(e) = self.ensure(&mut guard).await {
            let _ = out.send(wire::error_line("KernelStartError", &e.to_string(), &[]));
            let _ = out.send(wire::end_line());
            return;
        }
        self.catch_up_env(&mut guard).await;
        let env_code = wire::env_code(&self.language, &env);
        if let Some((set, _)) = &env_code {
            let _ = self.run(&mut guard, set.clone(), true, None, None).await;
        }
        let outcome = self.run(&mut guard, code, false, timeout, Some(&out)).await;
        // Put back what was there, unless the kernel is gone (a timeout keeps its state).
        if let Some((_, reset)) = env_code
            && matches!(outcome, Outcome::Done | Outcome::TimedOut(_))
        {
            let _ = self.run(&mut guard, reset, true, None, None).await;
        }
        match outcome {
            Outcome::Done => {}
            Outcome::TimedOut(t) => {
                let _ = out.send(wire::error_line(
                    "TimeoutError",
                    &format!(
                        "the execution ran past its timeout of {:.3} s and was interrupted",
                        t.as_secs_f64()
                    ),
                    &[],
                ));
            }
            Outcome::Died => {
                let _ = out
                    .send(wire::error_line(
                        "KernelDied",
                        "the kernel exited during the execution; the context's next execution starts a new one",
                        &[],
                    ))
                    ;
            }
            Outcome::Restarted => {
                let _ = out
                    .send(wire::error_line(
                        "KernelRestarted",
                        "the execution did not end when interrupted: the kernel was restarted and its state is lost",
                        &[],
                    ))
                    ;
            }
        }
        let _ = out.send(wire::end_line());
    }

    /// One execute request to its `idle`. Output goes to `out` when given.
    async fn run(
        &self,
        slot: &mut Option<Running>,
        code: String,
        silent: bool,
        timeout: Option<Duration>,
        out: Option<&Lines>,
    ) -> Outcome {
        let Some(r) = slot.as_mut() else {
            return Outcome::Died;
        };
        let mut request = ExecuteRequest::new(code);
        request.silent = silent;
        request.store_history = !silent;
        request.allow_stdin = false;
        request.stop_on_error = !silent;
        let message: JupyterMessage = request.into();
        let msg_id = message.header.msg_id.clone();
        if r.shell.send(message).await.is_err() {
            return Outcome::Died;
        }
        let started = Instant::now();
        let mut interrupted_at: Option<Instant> = None;
        let mut timed_out = None;
        // A line now and then while a cell is quiet: the relay closes a connection idle past the
        // deployment's limit, and that would interrupt a long silent cell.
        let mut keepalive =
            tokio::time::interval_at((Instant::now() + KEEPALIVE).into(), KEEPALIVE);
        let exit = loop {
            // The next thing that can happen: a message, the deadline, the caller leaving, the
            // kernel exiting, or an interrupt that did not take.
            let deadline = match (timeout, interrupted_at) {
                (_, Some(at)) => Some(at + INTERRUPT_GRACE),
                (Some(t), None) => Some(started + t),
                (None, None) => None,
            };
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            let gone = async {
                match out {
                    Some(tx) if interrupted_at.is_none() => tx.closed().await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = keepalive.tick(), if out.is_some() => {
                    if let Some(tx) = out {
                        let _ = tx.send(wire::keepalive_line());
                    }
                }
                msg = r.iopub.read() => {
                    let Ok(msg) = msg else { break Outcome::Died };
                    if msg.parent_header.as_ref().map(|h| h.msg_id.as_str()) != Some(msg_id.as_str()) {
                        continue;
                    }
                    match &msg.content {
                        JupyterMessageContent::Status(s) if s.execution_state == ExecutionState::Idle => break Outcome::Done,
                        JupyterMessageContent::ErrorOutput(e)
                            if timed_out.is_some() && e.ename == "KeyboardInterrupt" => {}
                        content => {
                            if let (Some(tx), Some(line)) = (out, wire::line_for(content)) {
                                let _ = tx.send(line);
                            }
                        }
                    }
                }
                _ = sleep => {
                    if interrupted_at.is_some() {
                        // The interrupt did not take: a fresh kernel at the next execution.
                        kill_group(&r.child, rustix::process::Signal::KILL);
                        break Outcome::Restarted;
                    }
                    timed_out = timeout;
                    interrupted_at = Some(Instant::now());
                    kill_group(&r.child, rustix::process::Signal::INT);
                }
                () = gone => {
                    interrupted_at = Some(Instant::now());
                    kill_group(&r.child, rustix::process::Signal::INT);
                }
                _ = r.child.wait() => break Outcome::Died,
            }
        };
        if exit != Outcome::Done {
            self.stop(slot).await;
            return exit;
        }
        // Its execute_reply, so the shell socket holds nothing stale.
        let end = Instant::now() + Duration::from_secs(5);
        while let Ok(Ok(reply)) = tokio::time::timeout_at(end.into(), r.shell.read()).await {
            if reply.parent_header.as_ref().map(|h| h.msg_id.as_str()) == Some(msg_id.as_str()) {
                break;
            }
        }
        match timed_out {
            Some(t) => Outcome::TimedOut(t),
            None => Outcome::Done,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Done,
    TimedOut(Duration),
    Died,
    Restarted,
}

fn signal_pid(pid: i32, sig: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process_group(pid, sig);
    }
}

fn kill_group(child: &Child, sig: rustix::process::Signal) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        signal_pid(pid, sig);
    }
}

fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}
