//! execd's stateful bash sessions (`/session`, `/session/{sid}/run`): one long-lived `bash`
//! per session, a background process of the sandbox reading its commands on stdin, so `cd`,
//! variables and functions carry from one run to the next. The session id is the process's id:
//! any replica finds it, nothing is kept here but a lock per session that keeps two runs of it
//! from interleaving on this replica.
//!
//! A run writes one script to the shell: a start marker on both streams, the command (as
//! `$'\xNN...'` through `eval`, so no quoting or syntax of it can reach past its own run; its
//! stdin `/dev/null`, so it cannot read the rest of the script or the next run's), and an end
//! marker on both streams, with its exit status on stdout. The run's output is what each
//! stream printed between its markers (each a fresh random nonce, so nothing the command prints
//! can end it early but by guessing). The script calls builtins by `builtin`; a session whose
//! user redefines `builtin` itself can still spoof its own later runs: a shared shell is the
//! sandbox's, as hostile as anything in it. A command that exits the shell ends the session with it; a run past its timeout
//! is interrupted (SIGINT to the shell's process group: the command ends, 130, and the session
//! stays), and its shell killed if the command outlives that (the session then has ended).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::execd::{Lines, PING_EVERY, deadline, end, gone, send_event};
use super::lifecycle::shell_quote;
use super::{Answer, Failure, OpenSandbox};
use crate::api::{ProcessEvent, ProcessEventType, ProcessSignal, StartProcessRequest};
use crate::ops::processes::{self as op, Target};

/// The prefix of a session's id (and of its shell's process id).
const PREFIX: &str = "osh-";
/// How long a run past its timeout has, once interrupted, before its shell is killed.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);
/// How long a run waits for the session's run before it (on this replica) to end.
const BUSY_WAIT: Duration = Duration::from_secs(60);
/// What the shell reads first: SIGINT runs a handler in it (so a run's interrupt ends the
/// command, not the session), while its commands keep SIGINT's default (a handler is not
/// inherited, an ignored signal would be).
const PROLOGUE: &str = "trap : INT\n";

/// A session's place on this replica: one run at a time, and the last event of its shell seen
/// (the next run follows from there, not from the shell's first event).
#[derive(Default)]
struct Slot {
    run: Arc<tokio::sync::Mutex<()>>,
    seen: AtomicU64,
}

/// A session's key: its sandbox and its id.
type Key = (String, String);

/// The sessions' slots, by sandbox and session.
#[derive(Clone, Default)]
pub struct Runs(Arc<Mutex<HashMap<Key, Arc<Slot>>>>);

impl Runs {
    fn slot(&self, id: &str, sid: &str) -> Arc<Slot> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.entry((id.to_string(), sid.to_string()))
            .or_default()
            .clone()
    }

    /// Drops the slot unless a run holds or waits for it.
    fn release(&self, id: &str, sid: &str) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = (id.to_string(), sid.to_string());
        if map.get(&key).is_some_and(|s| Arc::strong_count(s) == 1) {
            map.remove(&key);
        }
    }

    fn forget(&self, id: &str, sid: &str) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(&(id.to_string(), sid.to_string()));
    }
}

fn nonce() -> String {
    let bytes: [u8; 12] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A session id as its shell's process id: ours only.
fn shell_id(sid: &str) -> Result<String, Failure> {
    let ok = sid.len() == PREFIX.len() + 24
        && sid.starts_with(PREFIX)
        && sid[PREFIX.len()..].bytes().all(|b| b.is_ascii_hexdigit());
    ok.then(|| sid.to_string())
        .ok_or_else(|| Failure::new(StatusCode::NOT_FOUND, format!("no bash session {sid:?}")))
}

/// `text` as bash's ANSI-C quoting of its bytes (`$'\xNN...'`): nothing in it is syntax.
fn ansi_c(text: &str) -> String {
    let mut out = String::with_capacity(3 + text.len() * 4);
    out.push_str("$'");
    for b in text.bytes() {
        out.push_str(&format!("\\x{b:02x}"));
    }
    out.push('\'');
    out
}

#[derive(Debug, Default, Deserialize)]
struct NewSession {
    #[serde(default)]
    cwd: Option<String>,
}

/// `POST /session {cwd?}`: a shell started; `{session_id}`.
pub async fn create(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    raw: axum::body::Bytes,
) -> Answer {
    let req: NewSession = if raw.iter().all(u8::is_ascii_whitespace) {
        NewSession::default()
    } else {
        serde_json::from_slice(&raw).map_err(|e| Failure::bad_request(format!("body: {e}")))?
    };
    let sid = format!("{PREFIX}{}", nonce());
    let start = op::StartFollowed {
        req: StartProcessRequest {
            command: "exec bash --noprofile --norc -s".to_string(),
            environment: None,
            workdir: req.cwd.filter(|c| !c.is_empty()),
            process_id: Some(sid.clone()),
            tag: Some("bash session".to_string()),
            pty: None,
        },
        default_workdir: None,
        keep_stdin: true,
    };
    drop(s.reach(&id, start).await?.events);
    let prologue = op::Stdin {
        target: Target::Id(sid.clone()),
        bytes: Bytes::from_static(PROLOGUE.as_bytes()),
        eof: false,
    };
    s.reach(&id, prologue).await?;
    Ok(Json(json!({ "session_id": sid })).into_response())
}

/// `DELETE /session/{sid}`: its shell killed.
pub async fn delete(
    State(s): State<OpenSandbox>,
    Path((id, sid)): Path<(String, String)>,
) -> Answer {
    let sid = shell_id(&sid)?;
    let kill = op::Kill {
        target: Target::Id(sid.clone()),
    };
    let killed = s.reach(&id, kill).await;
    s.runs.forget(&id, &sid);
    killed?;
    // Answered once it has ended, so a run after the delete finds it gone (bounded: a shell
    // the kernel has not reaped yet is gone a moment later anyway).
    for _ in 0..100 {
        match s.reach(&id, op::Find(Target::Id(sid.clone()))).await {
            Ok(p) if p.running => tokio::time::sleep(Duration::from_millis(20)).await,
            _ => break,
        }
    }
    Ok(StatusCode::OK.into_response())
}

#[derive(Debug, Deserialize)]
struct Run {
    command: String,
    #[serde(default)]
    cwd: Option<String>,
    /// Milliseconds.
    #[serde(default)]
    timeout: Option<u64>,
}

/// `POST /session/{sid}/run {command, cwd?, timeout?}`: the command run in the session's shell
/// (after a `cd` to `cwd`, which stays), its output as execd's events.
pub async fn run(
    State(s): State<OpenSandbox>,
    Path((id, sid)): Path<(String, String)>,
    raw: axum::body::Bytes,
) -> Answer {
    let sid = shell_id(&sid)?;
    let req: Run =
        serde_json::from_slice(&raw).map_err(|e| Failure::bad_request(format!("body: {e}")))?;
    if req.command.contains('\0') {
        return Err(Failure::bad_request("command: no NUL"));
    }
    let slot = s.runs.slot(&id, &sid);
    // A run refused before it starts leaves no slot behind (an id of no session among them).
    let refused = |e: Failure, slot: Arc<Slot>| {
        drop(slot);
        s.runs.release(&id, &sid);
        e
    };
    let Ok(guard) = tokio::time::timeout(BUSY_WAIT, slot.run.clone().lock_owned()).await else {
        let busy = Failure::new(
            StatusCode::CONFLICT,
            format!("bash session {sid} is running another command; retry when it ends"),
        );
        return Err(refused(busy, slot));
    };
    // The shell's events from the last one a run here saw (from its first on another replica).
    let seen = slot.seen.load(Ordering::Relaxed);
    let events = op::Events {
        target: Target::Id(sid.clone()),
        after: (seen > 0).then_some(seen),
        follow: true,
    };
    let watched = match s.reach(&id, events).await {
        Ok(w) => w,
        Err(e) => {
            drop(guard);
            return Err(refused(e, slot));
        }
    };
    let (start, stop) = (nonce(), nonce());
    let cd = match req.cwd.as_deref().filter(|c| !c.is_empty()) {
        Some(dir) => format!("builtin cd -- {} && ", shell_quote(dir)),
        None => String::new(),
    };
    let script = format!(
        "builtin printf '%s\\n' {start}; builtin printf '%s\\n' {start} >&2\n\
         {{ {cd}builtin eval {command}; }} </dev/null\n\
         __daiv_rc=$?; builtin printf '%s\\n' {stop} >&2; \
         builtin printf '%s %s\\n' {stop} \"$__daiv_rc\"\n",
        command = ansi_c(&req.command),
    );
    let write = op::Stdin {
        target: Target::Id(sid.clone()),
        bytes: Bytes::from(script),
        eof: false,
    };
    if let Err(e) = s.reach(&id, write).await {
        // Its shell exited (a command ended it, or it was killed).
        let e = if e.status == StatusCode::CONFLICT && e.message.contains("has ended") {
            Failure::new(
                StatusCode::NOT_FOUND,
                format!("bash session {sid} has ended"),
            )
        } else {
            e
        };
        drop(guard);
        return Err(refused(e, slot));
    }
    let done = tokio_util::sync::CancellationToken::new();
    let killed = Arc::new(AtomicBool::new(false));
    if let Some(at) = deadline(req.timeout) {
        interrupt_at(&s, &id, &sid, at, done.clone(), killed.clone());
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(32);
    let marks = Marks { start, stop };
    tokio::spawn(async move {
        let run = Following {
            events: watched.events,
            marks,
            killed,
            tx,
        };
        let (last, alive) = run.follow(&sid).await;
        done.cancel();
        if alive {
            slot.seen.fetch_max(last, Ordering::Relaxed);
        } else {
            s.runs.forget(&id, &sid);
        }
        drop(guard);
        drop(slot);
        s.runs.release(&id, &sid);
    });
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|i| (i, rx)) });
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// At `at`, unless the run is `done`: SIGINT to the shell's process group (the command ends,
/// 130; the shell's handler keeps it); [`INTERRUPT_GRACE`] later, if still not done, the shell
/// is killed (`killed`). Whether or not anyone still reads the run's stream.
fn interrupt_at(
    s: &OpenSandbox,
    id: &str,
    sid: &str,
    at: tokio::time::Instant,
    done: tokio_util::sync::CancellationToken,
    killed: Arc<AtomicBool>,
) {
    let (s, id, sid) = (s.clone(), id.to_string(), sid.to_string());
    tokio::spawn(async move {
        tokio::select! {
            () = done.cancelled() => return,
            () = tokio::time::sleep_until(at) => {}
        }
        let signal = op::Signal {
            target: Target::Id(sid.clone()),
            signal: ProcessSignal::Int,
        };
        let _ = s.reach(&id, signal).await;
        tokio::select! {
            () = done.cancelled() => {}
            () = tokio::time::sleep(INTERRUPT_GRACE) => {
                killed.store(true, Ordering::SeqCst);
                let _ = s.reach(&id, op::Kill { target: Target::Id(sid) }).await;
            }
        }
    });
}

struct Marks {
    start: String,
    stop: String,
}

/// One run's following of its shell.
struct Following {
    events: mpsc::Receiver<ProcessEvent>,
    marks: Marks,
    killed: Arc<AtomicBool>,
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
}

/// One stream's state within a run.
#[derive(Default)]
struct Stream {
    lines: Lines,
    started: bool,
    done: bool,
}

impl Following {
    /// Follows the shell from the run's start markers to its end markers (one per stream);
    /// the last event seen, and whether the shell is still there.
    async fn follow(mut self, sid: &str) -> (u64, bool) {
        let mut last = 0u64;
        if !send_event(&self.tx, json!({ "type": "init", "text": sid })).await {
            return (last, true);
        }
        let began = std::time::Instant::now();
        let (mut out, mut err) = (Stream::default(), Stream::default());
        let mut code: Option<i64> = None;
        let mut ping =
            tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
        loop {
            if out.done && err.done {
                let mut ev = ProcessEvent::new(0, ProcessEventType::End);
                ev.exit_code = Some(code.unwrap_or(-1));
                ev.duration_ms = Some(began.elapsed().as_millis() as u64);
                let _ = send_event(&self.tx, end(&ev)).await;
                return (last, true);
            }
            let ev = tokio::select! {
                ev = self.events.recv() => ev,
                _ = ping.tick() => {
                    if !send_event(&self.tx, json!({ "type": "ping", "text": "pong" })).await {
                        return (last, true);
                    }
                    continue;
                }
            };
            let Some(ev) = ev else {
                let _ =
                    send_event(&self.tx, gone("the sandbox went before the command ended")).await;
                return (last, false);
            };
            last = last.max(ev.seq);
            ping.reset();
            let (kind, stream) = match ev.kind {
                ProcessEventType::Stdout => ("stdout", &mut out),
                ProcessEventType::Stderr => ("stderr", &mut err),
                ProcessEventType::End => {
                    let why = if self.killed.load(Ordering::SeqCst) {
                        "the run's timeout passed and its command outlived the interrupt: the \
                         session's shell was killed"
                    } else if out.started {
                        "the command ended the session's shell"
                    } else {
                        "the session's shell has ended"
                    };
                    let mut v = end(&ev);
                    if v["type"] == "execution_complete" {
                        v = gone(why);
                    } else {
                        v["error"]["traceback"] = json!([why]);
                    }
                    let _ = send_event(&self.tx, v).await;
                    return (last, false);
                }
                ProcessEventType::Start | ProcessEventType::Keepalive => continue,
            };
            for line in stream.lines.push(ev.data.as_deref().unwrap_or("")) {
                if !stream.started {
                    stream.started = line.ends_with(&self.marks.start);
                    continue;
                }
                if stream.done {
                    continue;
                }
                let (text, rest) = match line.rfind(&self.marks.stop) {
                    Some(at) => (&line[..at], Some(&line[at + self.marks.stop.len()..])),
                    None => (line.as_str(), None),
                };
                if (!text.is_empty() || rest.is_none())
                    && !send_event(&self.tx, json!({ "type": kind, "text": text })).await
                {
                    return (last, true);
                }
                if let Some(rest) = rest {
                    if kind == "stdout" {
                        code = rest.trim().parse().ok();
                    }
                    stream.done = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_goes_once_no_run_holds_it() {
        let runs = Runs::default();
        let held = runs.slot("a", "osh-1");
        let other = runs.slot("a", "osh-2");
        drop(other);
        runs.release("a", "osh-2");
        runs.release("a", "osh-1");
        let map = runs.0.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(map.len(), 1, "the held slot stays, the released one goes");
        assert!(map.contains_key(&("a".to_string(), "osh-1".to_string())));
        drop(map);
        drop(held);
    }

    #[test]
    fn a_command_is_bytes_bash_reads_back() {
        assert_eq!(ansi_c("a'b"), "$'\\x61\\x27\\x62'");
        assert!(shell_id("osh-0123456789abcdef01234567").is_ok());
        assert!(shell_id("osh-../../x").is_err());
        assert!(shell_id("p1-abc").is_err());
    }
}
