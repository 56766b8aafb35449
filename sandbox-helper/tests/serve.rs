//! The built binary driven over pipes with the protocol, as the control plane drives it.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use sandbox_protocol::frame::{Frame, encode, kind, read_frame};
use sandbox_protocol::message::{Event, Response};
use sandbox_protocol::wire::LISTING_CHUNK;
use serde_json::{Value, json};

struct Helper {
    child: Child,
    stdin: Option<ChildStdin>,
    frames: Receiver<Frame>,
    stash: HashMap<u32, Vec<Frame>>,
    next_id: u32,
}

/// Everything one request produced.
#[derive(Debug, Default)]
struct Reply {
    events: Vec<Event>,
    /// DATA payloads concatenated, per command index.
    output: HashMap<u32, Vec<u8>>,
    /// STDERR payloads concatenated, per command index (a split run).
    stderr: HashMap<u32, Vec<u8>>,
    /// Every DATA payload as it came (a listing's chunks).
    chunks: Vec<Vec<u8>>,
    response: Option<Response>,
}

impl Reply {
    fn ok(&self) -> Value {
        match self.response.clone().unwrap() {
            Response::Ok(v) => v,
            Response::Error(e) => panic!("error response: {e}"),
        }
    }

    fn err_kind(&self) -> String {
        match self.response.clone().unwrap() {
            Response::Error(e) => serde_json::to_value(e.kind)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string(),
            Response::Ok(v) => panic!("expected an error, got {v}"),
        }
    }

    fn text(&self, index: u32) -> String {
        String::from_utf8_lossy(self.output.get(&index).map_or(&[][..], |v| v)).into_owned()
    }

    fn finished(&self) -> Vec<(u32, i64, u64, bool)> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Finished {
                    index,
                    exit_code,
                    omitted,
                    timed_out,
                    ..
                } => Some((*index, *exit_code, *omitted, *timed_out)),
                _ => None,
            })
            .collect()
    }
}

impl Helper {
    fn start(root: &Path) -> Helper {
        Helper::start_with(root, &[])
    }

    fn start_with(root: &Path, extra: &[&OsStr]) -> Helper {
        let mut child = Command::new(env!("CARGO_BIN_EXE_daiv-sandbox-helper"))
            .args(["serve", "--root"])
            .arg(root)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            while let Ok(Some(f)) = read_frame(&mut stdout) {
                if tx.send(f).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let h = Helper {
            child,
            stdin,
            frames: rx,
            stash: HashMap::new(),
            next_id: 1,
        };
        let ready = h.frames.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!((ready.id, ready.kind), (0, kind::EVENT));
        let ev: Event = serde_json::from_slice(&ready.payload).unwrap();
        assert!(
            matches!(
                ev,
                Event::Ready {
                    protocol: sandbox_protocol::VERSION,
                    ..
                }
            ),
            "{ev:?}"
        );
        h
    }

    fn send(&mut self, id: u32, kind: u8, payload: &[u8]) {
        let mut buf = Vec::new();
        encode(id, kind, payload, &mut buf);
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(&buf).unwrap();
        stdin.flush().unwrap();
    }

    fn request(&mut self, req: &Value) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        self.send(id, kind::REQUEST, &serde_json::to_vec(req).unwrap());
        id
    }

    fn next_for(&mut self, id: u32, timeout: Duration) -> Option<Frame> {
        if let Some(v) = self.stash.get_mut(&id)
            && !v.is_empty()
        {
            return Some(v.remove(0));
        }
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.frames.recv_timeout(left) {
                Ok(f) if f.id == id => return Some(f),
                Ok(f) => self.stash.entry(f.id).or_default().push(f),
                Err(RecvTimeoutError::Timeout) => return None,
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    fn collect(&mut self, id: u32, timeout: Duration) -> Reply {
        let end = Instant::now() + timeout;
        let mut reply = Reply::default();
        let mut current = 0;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let f = self
                .next_for(id, left)
                .unwrap_or_else(|| panic!("no response for {id} in {timeout:?}: {reply:?}"));
            match f.kind {
                kind::EVENT => {
                    let ev: Event = serde_json::from_slice(&f.payload).unwrap();
                    if let Event::Started { index } = ev {
                        current = index;
                    }
                    reply.events.push(ev);
                }
                kind::DATA => {
                    reply
                        .output
                        .entry(current)
                        .or_default()
                        .extend_from_slice(&f.payload);
                    reply.chunks.push(f.payload);
                }
                kind::STDERR => reply
                    .stderr
                    .entry(current)
                    .or_default()
                    .extend_from_slice(&f.payload),
                kind::RESPONSE => {
                    reply.response = Some(serde_json::from_slice(&f.payload).unwrap());
                    return reply;
                }
                k => panic!("unexpected kind {k}"),
            }
        }
    }

    fn call(&mut self, req: Value) -> Reply {
        let id = self.request(&req);
        self.collect(id, Duration::from_secs(30))
    }

    /// An fs op's `ok` value; a streamed listing (`ls`, `glob`) as the one value the control
    /// plane makes of it, after checking it holds what its `listing` event announced.
    fn fs(&mut self, req: Value) -> Value {
        let key = if req["op"] == "glob" {
            "matches"
        } else {
            "entries"
        };
        let reply = self.call(req);
        listing(&reply).map_or_else(
            || reply.ok(),
            |entries| json!({key: entries, "error": null}),
        )
    }

    /// An op with input: the request, `data` in frames of `chunk` bytes, EOF.
    fn with_input(&mut self, req: Value, data: &[u8], chunk: usize) -> Reply {
        let id = self.request(&req);
        for c in data.chunks(chunk.max(1)) {
            self.send(id, kind::DATA, c);
        }
        self.send(id, kind::EOF, b"");
        self.collect(id, Duration::from_secs(30))
    }

    fn run(&mut self, commands: &[&str], extra: Value) -> Reply {
        let mut req = json!({"op": "run", "commands": commands, "workdir": "/workspace"});
        for (k, v) in extra.as_object().unwrap() {
            req[k] = v.clone();
        }
        self.call(req)
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A streamed listing's entries, checked against its `listing` event; `None` if it was not one.
fn listing(reply: &Reply) -> Option<Vec<Value>> {
    let (count, bytes) = reply.events.iter().find_map(|e| match e {
        Event::Listing { entries, bytes } => Some((*entries, *bytes)),
        _ => None,
    })?;
    assert_eq!(reply.ok(), json!({}));
    let mut all = Vec::new();
    let mut sent = 0;
    for c in &reply.chunks {
        let chunk: Vec<Value> = serde_json::from_slice(c).unwrap();
        assert!(!chunk.is_empty());
        assert!(c.len() <= LISTING_CHUNK || chunk.len() == 1, "{}", c.len());
        sent += c.len() - 1;
        all.extend(chunk);
    }
    assert_eq!(all.len() as u64, count);
    assert_eq!(sent as u64, bytes);
    Some(all)
}

fn code(v: &Value) -> Option<&str> {
    v["error"]["code"].as_str()
}

fn setup() -> (tempfile::TempDir, Helper) {
    let dir = tempfile::tempdir().unwrap();
    let h = Helper::start(dir.path());
    (dir, h)
}

// === lifecycle and protocol errors ===

#[test]
fn ready_ping_and_exit_at_eof() {
    let (_d, mut h) = setup();
    assert_eq!(h.fs(json!({"op": "ping"})), json!({}));
    drop(h.stdin.take());
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(status) = h.child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0));
            break;
        }
        assert!(Instant::now() < end, "helper did not exit at EOF");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn malformed_requests_are_bad_requests_and_oversize_frames_end_the_helper() {
    let (_d, mut h) = setup();
    h.send(5, kind::REQUEST, b"{not json");
    assert_eq!(
        h.collect(5, Duration::from_secs(5)).err_kind(),
        "bad_request"
    );
    h.send(6, kind::REQUEST, br#"{"op":"nope"}"#);
    assert_eq!(
        h.collect(6, Duration::from_secs(5)).err_kind(),
        "bad_request"
    );
    h.send(7, 42, b"");
    assert_eq!(
        h.collect(7, Duration::from_secs(5)).err_kind(),
        "bad_request"
    );
    // Still serving.
    assert_eq!(h.fs(json!({"op": "ping"})), json!({}));
    let len = ((sandbox_protocol::frame::MAX_PAYLOAD + 6) as u32).to_be_bytes();
    let stdin = h.stdin.as_mut().unwrap();
    stdin.write_all(&len).unwrap();
    stdin.flush().unwrap();
    // Rejected on the length alone: the helper may be gone before the rest arrives.
    let _ = stdin
        .write_all(&[0, 0, 0, 9, 1])
        .and_then(|()| stdin.flush());
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(status) = h.child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(2));
            break;
        }
        assert!(Instant::now() < end, "helper survived an oversize frame");
        std::thread::sleep(Duration::from_millis(10));
    }
}

// === run ===

#[test]
fn run_reports_exit_codes_pipefail_and_interleaved_output() {
    let (_d, mut h) = setup();
    let r = h.run(
        &[
            "exit 3",
            "false | true",
            "echo out; echo err >&2; echo out2",
            "kill -9 $$",
            "pwd; echo $GREETING",
        ],
        json!({"env": [["GREETING", "hi"]]}),
    );
    assert_eq!(r.ok(), json!({}));
    let codes: Vec<i64> = r.finished().iter().map(|f| f.1).collect();
    assert_eq!(codes, vec![3, 1, 0, 137, 0]);
    assert_eq!(r.text(2), "out\nerr\nout2\n");
    let pwd = r.text(4);
    assert!(pwd.ends_with("\nhi\n"), "{pwd:?}");
    assert_eq!(
        std::fs::canonicalize(pwd.lines().next().unwrap()).unwrap(),
        std::fs::canonicalize(_d.path()).unwrap()
    );
}

/// Protocol 4: a split run sends stderr as STDERR frames, each stream in its own order; an
/// unsplit one keeps both in one pipe, exactly interleaved.
#[test]
fn a_split_run_keeps_stdout_and_stderr_apart() {
    let (_d, mut h) = setup();
    let script = "for i in 1 2 3; do echo out$i; echo err$i >&2; done; echo é >&2";
    let r = h.run(&[script, "exit 4"], json!({"split": true}));
    assert_eq!(r.ok(), json!({}));
    assert_eq!(r.text(0), "out1\nout2\nout3\n");
    assert_eq!(
        String::from_utf8_lossy(&r.stderr[&0]),
        "err1\nerr2\nerr3\né\n"
    );
    assert_eq!(r.finished()[1].1, 4);
    let r = h.run(&[script], json!({}));
    assert_eq!(r.text(0), "out1\nerr1\nout2\nerr2\nout3\nerr3\né\n");
    assert!(r.stderr.is_empty());
}

#[test]
fn each_finished_command_says_what_it_cost() {
    let (_d, mut h) = setup();
    // CPU in a child of the shell (waited for), then 8 MB held by another child for a while.
    let r = h.run(
        &[
            "sh -c 'i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done'; sh -c 'x=$(head -c 8000000 /dev/zero | tr \"\\0\" a); sleep 0.3'",
            "exit 4",
        ],
        json!({}),
    );
    assert_eq!(r.ok(), json!({}));
    let usages: Vec<_> = r
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Finished { usage, .. } => Some(*usage),
            _ => None,
        })
        .collect();
    assert_eq!(usages.len(), 2);
    let busy = usages[0];
    assert!(busy.duration_ms.is_some_and(|d| d >= 300), "{busy:?}");
    assert!(busy.cpu_ms.is_some_and(|c| c >= 10), "{busy:?}");
    assert!(
        busy.max_rss_bytes.is_some_and(|m| m >= 8_000_000),
        "{busy:?}"
    );
    // A command over before its first sample may have no memory figure; time and CPU it has.
    assert!(
        usages[1].duration_ms.is_some() && usages[1].cpu_ms.is_some(),
        "{:?}",
        usages[1]
    );
}

#[test]
fn output_past_the_cap_is_counted_not_sent() {
    let (_d, mut h) = setup();
    let r = h.run(
        &["printf 0123456789abcdef", "head -c 300000 /dev/zero"],
        json!({"output_cap": 10}),
    );
    assert_eq!(r.text(0), "0123456789");
    assert_eq!(r.finished()[0], (0, 0, 6, false));
    assert_eq!(r.output[&1].len(), 10);
    assert_eq!(r.finished()[1].2, 300_000 - 10);
    // A large uncapped output arrives whole, in frames of at most 64 KiB.
    let r = h.run(&["head -c 1000000 /dev/zero"], json!({}));
    assert_eq!(r.output[&0].len(), 1_000_000);
}

fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

#[test]
fn a_timeout_kills_the_whole_group_and_skips_the_rest() {
    let (d, mut h) = setup();
    let start = Instant::now();
    let r = h.run(
        &[
            "sleep 1000 & echo $! > child.pid; echo started; sleep 1000",
            "echo never",
        ],
        json!({"timeout_ms": 500}),
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(r.finished(), vec![(0, 124, 0, true)]);
    assert_eq!(r.text(0), "started\n");
    let pid: u32 = std::fs::read_to_string(d.path().join("child.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        assert!(Instant::now() < end, "background sleep {pid} survived");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn fail_fast_stops_after_the_first_failure() {
    let (_d, mut h) = setup();
    let r = h.run(&["false", "echo x"], json!({"fail_fast": true}));
    assert_eq!(r.finished(), vec![(0, 1, 0, false)]);
    let r = h.run(&["false", "echo x"], json!({"fail_fast": false}));
    assert_eq!(r.finished().len(), 2);
    assert_eq!(r.text(1), "x\n");
}

#[test]
fn a_background_child_holding_stdout_does_not_hang_the_request() {
    let (_d, mut h) = setup();
    let start = Instant::now();
    let r = h.run(
        &["(sleep 5; echo late) & echo early", "echo next"],
        json!({}),
    );
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(r.text(0), "early\n");
    assert_eq!(r.text(1), "next\n");
    assert_eq!(r.finished().len(), 2);
}

#[test]
fn cancel_kills_the_running_command() {
    let (_d, mut h) = setup();
    let id = h
        .request(&json!({"op": "run", "commands": ["echo go; sleep 30"], "workdir": "/workspace"}));
    let first = h.next_for(id, Duration::from_secs(5)).unwrap();
    assert_eq!(first.kind, kind::EVENT);
    let start = Instant::now();
    h.send(id, kind::CANCEL, b"");
    let r = h.collect(id, Duration::from_secs(5));
    assert_eq!(r.err_kind(), "cancelled");
    assert!(start.elapsed() < Duration::from_secs(2));
    // Other requests were unaffected meanwhile.
    assert_eq!(h.fs(json!({"op": "ping"})), json!({}));
}

#[test]
fn requests_interleave() {
    let (_d, mut h) = setup();
    let slow = h.request(
        &json!({"op": "run", "commands": ["sleep 1; echo slow"], "workdir": "/workspace"}),
    );
    let start = Instant::now();
    assert_eq!(h.fs(json!({"op": "ping"})), json!({}));
    assert!(start.elapsed() < Duration::from_millis(900));
    let r = h.collect(slow, Duration::from_secs(10));
    assert_eq!(r.text(0), "slow\n");
}

// === fs ===

#[test]
fn ls_glob_and_their_errors() {
    let (d, mut h) = setup();
    let p = d.path();
    std::fs::create_dir_all(p.join("repo/src/deep")).unwrap();
    std::fs::create_dir_all(p.join("repo/node_modules/x")).unwrap();
    std::fs::write(p.join("repo/b.txt"), "b").unwrap();
    std::fs::write(p.join("repo/a.rs"), "a").unwrap();
    std::fs::write(p.join("repo/src/lib.rs"), "x").unwrap();
    std::fs::write(p.join("repo/src/deep/m.rs"), "x").unwrap();
    std::fs::write(p.join("repo/node_modules/x/i.rs"), "x").unwrap();
    symlink("src", p.join("repo/zlink")).unwrap();
    let v = h.fs(json!({"op": "ls", "path": "/workspace/repo/"}));
    assert_eq!(
        v,
        json!({"entries": [
            {"path": "/workspace/repo/node_modules", "is_dir": true},
            {"path": "/workspace/repo/src", "is_dir": true},
            {"path": "/workspace/repo/a.rs", "is_dir": false},
            {"path": "/workspace/repo/b.txt", "is_dir": false},
            {"path": "/workspace/repo/zlink", "is_dir": false},
        ], "error": null})
    );
    // ls through a link to a directory lists the directory.
    let v = h.fs(json!({"op": "ls", "path": "/workspace/repo/zlink"}));
    assert_eq!(v["entries"][0]["path"], "/workspace/repo/zlink/deep");
    let v = h.fs(json!({"op": "ls", "path": "/workspace/nope"}));
    assert_eq!(code(&v), Some("not_found"));
    assert_eq!(v["error"]["message"], "/workspace/nope does not exist");
    let v = h.fs(json!({"op": "ls", "path": "/workspace/repo/a.rs"}));
    assert_eq!(code(&v), Some("not_a_directory"));
    let v = h.fs(json!({"op": "ls", "path": "/etc"}));
    assert_eq!(code(&v), Some("invalid_path"));

    let v = h.fs(json!({"op": "glob", "pattern": "**/*.rs", "path": "/workspace/repo", "prune": ["node_modules"]}));
    let paths: Vec<&str> = v["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        vec![
            "/workspace/repo/a.rs",
            "/workspace/repo/src/deep/m.rs",
            "/workspace/repo/src/lib.rs"
        ]
    );
    // `*` does not cross `/`; the path prefix in the pattern is trimmed.
    let v = h.fs(json!({"op": "glob", "pattern": "/workspace/repo/*.rs", "path": "/workspace/repo", "prune": []}));
    assert_eq!(
        v["matches"],
        json!([{"path": "/workspace/repo/a.rs", "is_dir": false}])
    );
    let v = h.fs(json!({"op": "glob", "pattern": "s*", "path": "/workspace/repo", "prune": []}));
    assert_eq!(
        v["matches"],
        json!([{"path": "/workspace/repo/src", "is_dir": true}])
    );
    let v = h.fs(json!({"op": "glob", "pattern": "[", "path": "/workspace/repo", "prune": []}));
    assert_eq!(code(&v), Some("invalid_pattern"));
    let v =
        h.fs(json!({"op": "glob", "pattern": "*", "path": "/workspace/repo/a.rs", "prune": []}));
    assert_eq!(code(&v), Some("not_a_directory"));
}

#[test]
fn read_pages_and_refuses_what_is_not_a_regular_file() {
    let (d, mut h) = setup();
    let p = d.path();
    std::fs::write(p.join("t.txt"), "a\nb\nc\n").unwrap();
    std::fs::write(p.join("empty"), "").unwrap();
    std::fs::write(p.join("bin"), b"\xff\x00\x01").unwrap();
    std::fs::create_dir(p.join("dir")).unwrap();
    symlink("t.txt", p.join("link")).unwrap();
    let v = h.fs(json!({"op": "read", "path": "/workspace/t.txt", "offset": 1, "limit": 1}));
    assert_eq!(
        v,
        json!({"content": "b", "encoding": "utf-8", "total_lines": 3, "end_line": 2, "truncated": false, "error": null})
    );
    let v = h.fs(json!({"op": "read", "path": "/workspace/link"}));
    assert_eq!(v["content"], "a\nb\nc");
    let v = h.fs(json!({"op": "read", "path": "/workspace/empty"}));
    assert_eq!(v["content"], sandbox_protocol::wire::EMPTY_FILE_SENTINEL);
    let v = h.fs(json!({"op": "read", "path": "/workspace/bin"}));
    assert_eq!(
        (v["content"].as_str(), v["encoding"].as_str()),
        (Some("/wAB"), Some("base64"))
    );
    let v = h.fs(json!({"op": "read", "path": "/workspace/t.txt", "offset": 3}));
    assert_eq!(code(&v), Some("invalid_offset"));
    let v = h.fs(json!({"op": "read", "path": "/workspace/dir"}));
    assert_eq!(code(&v), Some("is_a_directory"));
    let v = h.fs(json!({"op": "read", "path": "/workspace/missing"}));
    assert_eq!(code(&v), Some("not_found"));
    let v = h.fs(json!({"op": "read", "path": "/workspace"}));
    assert_eq!(code(&v), Some("invalid_path"));
    let fifo = p.join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let start = Instant::now();
    let v = h.fs(json!({"op": "read", "path": "/workspace/fifo"}));
    assert_eq!(code(&v), Some("exec_failed"));
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[test]
fn grep_matches_regular_files_and_returns_promptly_on_a_fifo() {
    let (d, mut h) = setup();
    let p = d.path();
    std::fs::create_dir_all(p.join("r/sub")).unwrap();
    std::fs::create_dir_all(p.join("r/target")).unwrap();
    std::fs::write(p.join("r/a.txt"), "hello\nhelo\nnope\r\nhelllo\r\n").unwrap();
    std::fs::write(p.join("r/sub/b.rs"), "fn hello() {}\n").unwrap();
    std::fs::write(p.join("r/target/c.txt"), "hello\n").unwrap();
    std::fs::write(p.join("r/bin.dat"), b"hello\x00\n").unwrap();
    symlink("a.txt", p.join("r/link.txt")).unwrap();
    assert!(
        Command::new("mkfifo")
            .arg(p.join("r/fifo"))
            .status()
            .unwrap()
            .success()
    );
    let start = Instant::now();
    let v = h.fs(json!({"op": "grep", "pattern": "hel+o", "path": "/workspace/r", "glob": null, "prune": ["target"]}));
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(
        v,
        json!({"matches": [
            {"path": "/workspace/r/a.txt", "line": 1, "text": "hello"},
            {"path": "/workspace/r/a.txt", "line": 2, "text": "helo"},
            {"path": "/workspace/r/a.txt", "line": 4, "text": "helllo"},
            {"path": "/workspace/r/sub/b.rs", "line": 1, "text": "fn hello() {}"},
        ], "truncated": false, "error": null})
    );
    let v = h.fs(json!({"op": "grep", "pattern": "hello", "path": "/workspace/r", "glob": "*.rs", "prune": []}));
    assert_eq!(v["matches"].as_array().unwrap().len(), 1);
    // A single file, through a link; a FIFO named directly answers at once with nothing.
    let v = h.fs(
        json!({"op": "grep", "pattern": "^helo$", "path": "/workspace/r/link.txt", "prune": []}),
    );
    assert_eq!(
        v["matches"],
        json!([{"path": "/workspace/r/link.txt", "line": 2, "text": "helo"}])
    );
    let start = Instant::now();
    let v = h.fs(json!({"op": "grep", "pattern": "x", "path": "/workspace/r/fifo", "prune": []}));
    assert_eq!(v["matches"], json!([]));
    assert!(start.elapsed() < Duration::from_secs(2));
    let v = h.fs(json!({"op": "grep", "pattern": "a(", "path": "/workspace/r", "prune": []}));
    assert_eq!(code(&v), Some("invalid_pattern"));
    let v = h.fs(json!({"op": "grep", "pattern": "a", "path": "/workspace/none", "prune": []}));
    assert_eq!(code(&v), Some("not_found"));
    // Truncation at 200 matches.
    std::fs::write(p.join("r/many.txt"), "x\n".repeat(500)).unwrap();
    let v =
        h.fs(json!({"op": "grep", "pattern": "x", "path": "/workspace/r/many.txt", "prune": []}));
    assert_eq!(v["matches"].as_array().unwrap().len(), 200);
    assert_eq!(v["truncated"], true);
}

#[test]
fn write_edit_delete() {
    let (d, mut h) = setup();
    let p = d.path();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let r = h.with_input(
        json!({"op": "write", "path": "/workspace/new/dir/f.bin", "mode": 0o640}),
        &big,
        1000,
    );
    assert_eq!(r.ok(), json!({"ok": true, "error": null}));
    assert_eq!(std::fs::read(p.join("new/dir/f.bin")).unwrap(), big);
    let meta = std::fs::metadata(p.join("new/dir/f.bin")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
    assert_eq!(
        std::fs::metadata(p.join("new/dir"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    let r = h.with_input(
        json!({"op": "write", "path": "/workspace/new/dir/f.bin"}),
        b"x",
        1,
    );
    assert_eq!(code(&r.ok()), Some("already_exists"));
    assert_eq!(
        std::fs::read(p.join("new/dir/f.bin")).unwrap().len(),
        big.len()
    );
    let r = h.with_input(
        json!({"op": "write", "path": "/workspace/new/dir/f.bin/x"}),
        b"x",
        1,
    );
    assert_eq!(code(&r.ok()), Some("exec_failed"));
    let r = h.with_input(
        json!({"op": "write", "path": "/workspace/x", "mode": 0o17777}),
        b"x",
        1,
    );
    assert_eq!(r.err_kind(), "bad_request");
    let r = h.with_input(json!({"op": "write", "path": "/workspace/e.txt"}), b"", 1);
    assert_eq!(r.ok()["ok"], true);
    assert_eq!(std::fs::read(p.join("e.txt")).unwrap(), b"");

    // edit: replace, keep the mode, follow a link to the file it names.
    let text = "line one\nline two\n".repeat(50_000);
    let r = h.with_input(
        json!({"op": "write", "path": "/workspace/t.txt", "mode": 0o600}),
        text.as_bytes(),
        65_536,
    );
    assert_eq!(r.ok()["ok"], true);
    symlink("t.txt", p.join("t.link")).unwrap();
    let v = h.fs(json!({"op": "edit", "path": "/workspace/t.link", "old": "two", "new": "2", "replace_all": true}));
    assert_eq!(v, json!({"occurrences": 50_000, "error": null}));
    assert_eq!(
        std::fs::read_to_string(p.join("t.txt")).unwrap(),
        "line one\nline 2\n".repeat(50_000)
    );
    assert!(
        std::fs::symlink_metadata(p.join("t.link"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        std::fs::metadata(p.join("t.txt"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    let v = h.fs(json!({"op": "edit", "path": "/workspace/t.txt", "old": "one", "new": "1"}));
    assert_eq!(code(&v), Some("multiple_occurrences"));
    let v = h.fs(json!({"op": "edit", "path": "/workspace/t.txt", "old": "zzz", "new": "1"}));
    assert_eq!(code(&v), Some("string_not_found"));
    let v = h.fs(json!({"op": "edit", "path": "/workspace/new/dir/f.bin", "old": "", "new": "1"}));
    assert_eq!(code(&v), Some("string_not_found"));
    std::fs::write(p.join("latin1"), b"caf\xe9").unwrap();
    let v = h.fs(json!({"op": "edit", "path": "/workspace/latin1", "old": "caf", "new": "x"}));
    assert_eq!(code(&v), Some("not_a_text_file"));
    // No temporary files left behind.
    let leftovers: Vec<_> = std::fs::read_dir(p)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".daiv-edit"))
        .collect();
    assert!(leftovers.is_empty());

    // delete: a file, a symlink itself (never its target), not a directory, absent is fine.
    let v = h.fs(json!({"op": "delete", "path": "/workspace/t.link"}));
    assert_eq!(v, json!({"ok": true, "removed": true, "error": null}));
    assert!(p.join("t.txt").exists());
    let v = h.fs(json!({"op": "delete", "path": "/workspace/new"}));
    assert_eq!(code(&v), Some("is_a_directory"));
    let v = h.fs(json!({"op": "delete", "path": "/workspace/t.txt"}));
    assert_eq!(v["removed"], true);
    let v = h.fs(json!({"op": "delete", "path": "/workspace/t.txt"}));
    assert_eq!(v, json!({"ok": true, "removed": false, "error": null}));
}

#[test]
fn symlinks_to_outside_are_refused_and_never_followed() {
    let (d, mut h) = setup();
    let outside = tempfile::tempdir().unwrap();
    let p = d.path();
    let secret = outside.path().join("secret");
    std::fs::write(&secret, "secret\n").unwrap();
    symlink(&secret, p.join("file-link")).unwrap();
    symlink(outside.path(), p.join("dir-link")).unwrap();
    symlink("../../../../../../..", p.join("up")).unwrap();
    std::fs::create_dir(p.join("repo")).unwrap();
    std::fs::write(p.join("repo/ok.txt"), "inside\n").unwrap();
    symlink("/workspace/repo/ok.txt", p.join("abs-inside")).unwrap();

    let v = h.fs(json!({"op": "read", "path": "/workspace/file-link"}));
    assert_eq!(code(&v), Some("permission_denied"));
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("outside /workspace") && !msg.contains(outside.path().to_str().unwrap()),
        "{msg}"
    );
    let v = h.fs(json!({"op": "read", "path": "/workspace/dir-link/secret"}));
    assert_eq!(code(&v), Some("permission_denied"));
    let v = h
        .fs(json!({"op": "edit", "path": "/workspace/file-link", "old": "secret", "new": "pwned"}));
    assert_eq!(code(&v), Some("permission_denied"));
    let r = h.with_input(
        json!({"op": "write", "path": "/workspace/dir-link/planted"}),
        b"x",
        1,
    );
    assert_eq!(code(&r.ok()), Some("permission_denied"));
    let v = h.fs(json!({"op": "ls", "path": "/workspace/dir-link"}));
    assert_eq!(code(&v), Some("permission_denied"));
    let v = h
        .fs(json!({"op": "grep", "pattern": "secret", "path": "/workspace/dir-link", "prune": []}));
    assert_eq!(code(&v), Some("permission_denied"));
    // A walk never follows links: grepping the root does not see the secret.
    let v = h.fs(json!({"op": "grep", "pattern": "secret", "path": "/workspace", "prune": []}));
    assert_eq!(v["matches"], json!([]));
    // `..` stops at the root: "up" is the root itself.
    let v = h.fs(json!({"op": "read", "path": "/workspace/up/repo/ok.txt"}));
    assert_eq!(v["content"], "inside");
    let v = h.fs(json!({"op": "read", "path": "/workspace/abs-inside"}));
    assert_eq!(v["content"], "inside");
    // Deleting the link removes the link only.
    let v = h.fs(json!({"op": "delete", "path": "/workspace/file-link"}));
    assert_eq!(v["removed"], true);
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "secret\n");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
}

#[test]
fn a_symlink_swap_race_never_lands_outside() {
    let (d, mut h) = setup();
    let outside = tempfile::tempdir().unwrap();
    let p = d.path().to_path_buf();
    std::fs::create_dir(p.join("d")).unwrap();
    symlink(outside.path(), p.join("e")).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (p, stop) = (p.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    p.join("d").as_path(),
                    rustix::fs::CWD,
                    p.join("e").as_path(),
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
                n += 1;
            }
            n
        })
    };
    let mut written = 0;
    for i in 0..200 {
        let r = h.with_input(
            json!({"op": "write", "path": format!("/workspace/d/f{i}")}),
            b"data",
            4,
        );
        let v = r.ok();
        if v["ok"] == true {
            written += 1;
        } else {
            assert_eq!(code(&v), Some("permission_denied"), "{v}");
        }
        let v = h.fs(json!({"op": "read", "path": format!("/workspace/d/f{i}")}));
        assert!(
            v["content"] == "data" || v["error"]["code"].is_string(),
            "{v}"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 100, "the race barely ran: {swaps} swaps");
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "a write landed outside the root"
    );
    // Whatever was written is inside (under d or e, whichever is the real directory now).
    let real = if p.join("d").is_symlink() { "e" } else { "d" };
    assert_eq!(std::fs::read_dir(p.join(real)).unwrap().count(), written);
}

#[test]
fn names_that_are_not_utf8_work() {
    let (d, mut h) = setup();
    let p = d.path();
    let name = OsStr::from_bytes(b"caf\xe9.txt");
    std::fs::write(p.join(name), "needle\n").unwrap();
    let v = h.fs(json!({"op": "ls", "path": "/workspace"}));
    assert_eq!(
        v["entries"],
        json!([{"path": "/workspace/caf\u{fffd}.txt", "is_dir": false}])
    );
    let v = h.fs(json!({"op": "glob", "pattern": "caf*", "path": "/workspace", "prune": []}));
    assert_eq!(v["matches"].as_array().unwrap().len(), 1);
    let v = h.fs(json!({"op": "grep", "pattern": "needle", "path": "/workspace", "prune": []}));
    assert_eq!(v["matches"][0]["path"], "/workspace/caf\u{fffd}.txt");

    let mut b = tar::Builder::new(Vec::new());
    let mut hd = tar::Header::new_gnu();
    hd.set_size(3);
    hd.set_mode(0o644);
    hd.set_entry_type(tar::EntryType::Regular);
    b.append_data(
        &mut hd,
        Path::new(OsStr::from_bytes(b"dir\xff/f\xfe")),
        &b"abc"[..],
    )
    .unwrap();
    let tar = b.into_inner().unwrap();
    let r = h.with_input(
        json!({"op": "extract", "dest": "/workspace/seed"}),
        &tar,
        100,
    );
    assert_eq!(r.ok()["files"], 1);
    let got = std::fs::read(p.join("seed").join(OsStr::from_bytes(b"dir\xff/f\xfe"))).unwrap();
    assert_eq!(got, b"abc");
}

#[test]
fn listings_answer_every_entry_within_their_byte_bound() {
    // A directory of any size is listed whole, in chunks; only a listing over the request's
    // bound is refused, as an error with nothing of it sent.
    let (d, mut h) = setup();
    std::fs::create_dir(d.path().join("big")).unwrap();
    for i in 0..10_000 {
        std::fs::write(d.path().join(format!("big/f{i:05}.py")), "").unwrap();
    }
    std::fs::create_dir(d.path().join("big/subdir")).unwrap();
    let v = h.fs(json!({"op": "ls", "path": "/workspace/big"}));
    let entries = v["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 10_001);
    assert_eq!(v.get("truncated"), None);
    // Directories first, then the rest, each sorted.
    assert_eq!(entries[0]["path"], "/workspace/big/subdir");
    assert_eq!(entries[1]["path"], "/workspace/big/f00000.py");
    assert_eq!(entries[10_000]["path"], "/workspace/big/f09999.py");
    let v = h.fs(json!({"op": "glob", "pattern": "**/*.py", "path": "/workspace", "prune": []}));
    let matches: Vec<&str> = v["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    let want: Vec<String> = (0..10_000)
        .map(|i| format!("/workspace/big/f{i:05}.py"))
        .collect();
    assert_eq!(matches, want);

    // The bound: each entry's JSON and its comma. 10,000 of
    // `{"path":"/workspace/big/f00000.py","is_dir":false}` are 510,000 bytes.
    let glob = |max: u64| json!({"op": "glob", "pattern": "f*", "path": "/workspace/big", "prune": [], "max_bytes": max});
    let r = h.call(glob(510_000));
    assert_eq!(listing(&r).unwrap().len(), 10_000);
    let r = h.call(glob(509_999));
    assert!(listing(&r).is_none() && r.chunks.is_empty(), "{r:?}");
    let v = r.ok();
    assert_eq!(code(&v), Some("too_large"), "{v}");
    assert_eq!(v["matches"], json!([]));
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/workspace/big is over the 509999-byte limit"),
        "{v}"
    );
    let r = h.call(json!({"op": "ls", "path": "/workspace/big", "max_bytes": 100_000}));
    assert!(listing(&r).is_none() && r.chunks.is_empty(), "{r:?}");
    assert_eq!(code(&r.ok()), Some("too_large"));
}

#[test]
fn extract_and_clear() {
    let (d, mut h) = setup();
    let outside = tempfile::tempdir().unwrap();
    let p = d.path();
    std::fs::create_dir_all(p.join("repo")).unwrap();
    symlink(outside.path(), p.join("repo/trap")).unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o750);
    dir.set_size(0);
    b.append_data(&mut dir, "src/", &b""[..]).unwrap();
    let mut f = tar::Header::new_gnu();
    f.set_entry_type(tar::EntryType::Regular);
    f.set_mode(0o755);
    f.set_size(5);
    f.set_mtime(1_000_000_000);
    b.append_data(&mut f, "src/run.sh", &b"echo\n"[..]).unwrap();
    let mut f2 = f.clone();
    f2.set_size(4);
    b.append_data(&mut f2, "implicit/parent/file", &b"data"[..])
        .unwrap();
    b.append_data(&mut f2, "trap/escaped", &b"data"[..])
        .unwrap();
    let mut l = tar::Header::new_gnu();
    l.set_entry_type(tar::EntryType::Symlink);
    l.set_size(0);
    b.append_link(&mut l, "src/link", "run.sh").unwrap();
    let long = format!("{}/x.txt", "n".repeat(150));
    b.append_data(&mut f2, &long, &b"long"[..]).unwrap();
    let tar = b.into_inner().unwrap();
    let r = h.with_input(json!({"op": "extract", "dest": "/workspace/repo"}), &tar, 7);
    assert_eq!(
        r.ok(),
        json!({"files": 3, "dirs": 1, "symlinks": 1, "bytes": 13, "skipped": 1})
    );
    let meta = std::fs::metadata(p.join("repo/src/run.sh")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o755);
    assert_eq!(std::os::unix::fs::MetadataExt::mtime(&meta), 1_000_000_000);
    assert_eq!(
        std::fs::metadata(p.join("repo/src"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o750
    );
    assert_eq!(
        std::fs::read_link(p.join("repo/src/link")).unwrap(),
        Path::new("run.sh")
    );
    assert_eq!(
        std::fs::read(p.join("repo/implicit/parent/file")).unwrap(),
        b"data"
    );
    assert_eq!(std::fs::read(p.join("repo").join(&long)).unwrap(), b"long");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);

    std::fs::write(outside.path().join("keep"), "k").unwrap();
    let r = h.call(json!({"op": "clear", "dest": "/workspace/repo"}));
    assert_eq!(r.ok(), json!({}));
    assert!(p.join("repo").is_dir());
    assert_eq!(std::fs::read_dir(p.join("repo")).unwrap().count(), 0);
    assert!(outside.path().join("keep").exists());
    let r = h.call(json!({"op": "clear", "dest": "/workspace/absent"}));
    assert_eq!(r.ok(), json!({}));
}

#[test]
fn a_passed_deadline_answers_deadline() {
    let (d, mut h) = setup();
    std::fs::create_dir(d.path().join("w")).unwrap();
    for i in 0..3000 {
        std::fs::write(d.path().join(format!("w/f{i}")), "x\n").unwrap();
    }
    let r = h.call(json!({"op": "grep", "pattern": "x", "path": "/workspace/w", "prune": [], "deadline_ms": 0}));
    assert_eq!(r.err_kind(), "deadline");
}

/// A full disk: writes and edits answer `exec_failed` naming ENOSPC, leave no partial file, and
/// the helper keeps serving. Needs root (a 64 KiB tmpfs), as the suite has on CI and here.
#[test]
fn a_full_disk_is_a_clear_error_and_nothing_half_written_stays() {
    let dir = tempfile::tempdir().unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(mounted.success(), "mounting a tmpfs needs root");
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(dir.path());
    let mut h = Helper::start(dir.path());
    let big = vec![b'x'; 256 * 1024];
    let r = h.with_input(
        json!({"op": "write", "path": "/workspace/big.bin"}),
        &big,
        64 * 1024,
    );
    let v = r.ok();
    assert_eq!(code(&v), Some("exec_failed"), "{v}");
    assert!(v.to_string().contains("no space left"), "{v}");
    assert!(
        !dir.path().join("big.bin").exists(),
        "a partial file was left"
    );
    // Edits that need room fail the same way and keep the original.
    let small = vec![b'y'; 40 * 1024];
    let r = h.with_input(
        json!({"op": "write", "path": "/workspace/s.txt"}),
        &small,
        64 * 1024,
    );
    assert_eq!(code(&r.ok()), None);
    let r = h.call(json!({"op": "edit", "path": "/workspace/s.txt", "old": "y", "new": "zz", "replace_all": true}));
    let v = r.ok();
    assert_eq!(code(&v), Some("exec_failed"), "{v}");
    assert_eq!(std::fs::read(dir.path().join("s.txt")).unwrap(), small);
    // Still serving.
    let r = h.call(json!({"op": "ls", "path": "/workspace"}));
    assert_eq!(code(&r.ok()), None);
}

// === the data plane: paths anywhere, the service directory refused ===

/// A helper serving a workspace, with a service directory of its own beside it; `outside` is a
/// directory outside both (a path "anywhere").
fn setup_anywhere() -> (
    tempfile::TempDir,
    Helper,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let service = dir.path().join("service");
    let outside = dir.path().join("outside");
    for d in [&ws, &service, &outside] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::write(service.join("environment"), b"secret").unwrap();
    let h = Helper::start_with(&ws, &[OsStr::new("--service-dir"), service.as_os_str()]);
    (dir, h, outside, service)
}

fn p(path: &Path) -> String {
    path.to_str().unwrap().to_string()
}

/// `in_place`: the file itself is written (its inode kept, so a watcher sees its own events and
/// one who holds it open sees the new content); a new file gets the mode, an existing one keeps
/// its bits unless a mode is asked for; no temporary file is ever made beside it.
#[test]
fn a_write_in_place_keeps_the_file_and_its_watchers() {
    use std::os::unix::fs::MetadataExt;
    let (_d, mut h, outside, _service) = setup_anywhere();
    let target = outside.join("in/place.txt");
    let r = h.with_input(
        json!({"op": "file_write", "path": p(&target), "max_bytes": 100, "in_place": true, "mode": 0o640}),
        b"first version",
        4,
    );
    assert_eq!(r.ok(), json!({"bytes": 13, "error": null}));
    let meta = std::fs::metadata(&target).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o640);
    let held = std::fs::File::open(&target).unwrap();
    let id = h.request(&json!({"op": "watch", "path": p(&outside.join("in"))}));
    assert_eq!(next_change(&mut h, id).0, "armed");
    let r = h.with_input(
        json!({"op": "file_write", "path": p(&target), "max_bytes": 100, "in_place": true}),
        b"second",
        3,
    );
    assert_eq!(r.ok()["error"], Value::Null);
    assert_eq!(std::fs::read(&target).unwrap(), b"second");
    let now = std::fs::metadata(&target).unwrap();
    assert_eq!(now.ino(), meta.ino(), "the same file");
    assert_eq!(now.permissions().mode() & 0o777, 0o640, "its bits kept");
    assert_eq!(
        held.metadata().unwrap().len(),
        6,
        "the open file is the new one"
    );
    // The watcher sees the file's own write, nothing of a temporary file.
    let (change, path, _) = next_change(&mut h, id);
    assert_eq!((change.as_str(), path), ("write", p(&target)));
    h.send(id, kind::CANCEL, b"");
    // Over the cap: refused (what came before the cap stays, as a shell's `>` leaves it).
    let r = h.with_input(
        json!({"op": "file_write", "path": p(&target), "max_bytes": 4, "in_place": true}),
        b"too long",
        3,
    );
    assert_eq!(code(&r.ok()), Some("too_large"));
    assert_eq!(std::fs::read_dir(outside.join("in")).unwrap().count(), 1);
}

#[test]
fn raw_files_anywhere_round_trip_in_chunks_and_replace_atomically() {
    let (_d, mut h, outside, _service) = setup_anywhere();
    let target = outside.join("new/dir/blob.bin");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let r = h.with_input(
        json!({"op": "file_write", "path": p(&target), "max_bytes": 1_000_000}),
        &data,
        65_536,
    );
    assert_eq!(r.ok(), json!({"bytes": 300_000, "error": null}));
    assert_eq!(std::fs::read(&target).unwrap(), data);
    // Replaced: the old inode stays whole for whoever holds it open.
    let old = std::fs::File::open(&target).unwrap();
    let r = h.with_input(
        json!({"op": "file_write", "path": p(&target), "max_bytes": 10, "mode": 0o600}),
        b"new",
        2,
    );
    assert_eq!(r.ok()["error"], Value::Null);
    assert_eq!(std::fs::read(&target).unwrap(), b"new");
    assert_eq!(old.metadata().unwrap().len(), 300_000);
    assert_eq!(
        std::fs::metadata(&target).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Over the cap: refused, the old file kept, no temporary left beside it.
    let r = h.with_input(
        json!({"op": "file_write", "path": p(&target), "max_bytes": 4}),
        b"too long",
        3,
    );
    assert_eq!(code(&r.ok()), Some("too_large"));
    assert_eq!(std::fs::read(&target).unwrap(), b"new");
    assert_eq!(
        std::fs::read_dir(target.parent().unwrap()).unwrap().count(),
        1
    );
    // parents=false refuses a missing parent.
    let r = h.with_input(
        json!({"op": "file_write", "path": p(&outside.join("nope/x")), "max_bytes": 4, "parents": false}),
        b"x",
        1,
    );
    assert_eq!(code(&r.ok()), Some("not_found"));

    // Read back whole, then ranges.
    std::fs::write(&target, &data).unwrap();
    let r = h.call(json!({"op": "file_read", "path": p(&target)}));
    assert_eq!(
        r.events,
        vec![Event::File {
            size: 300_000,
            start: 0,
            length: 300_000
        }]
    );
    assert_eq!(r.output.get(&0).unwrap(), &data);
    assert_eq!(r.ok(), json!({"bytes": 300_000, "error": null}));
    let r =
        h.call(json!({"op": "file_read", "path": p(&target), "range": {"first": 10, "last": 19}}));
    assert_eq!(r.output.get(&0).unwrap(), &data[10..20]);
    let r = h.call(json!({"op": "file_read", "path": p(&target), "range": {"last": 5}}));
    assert_eq!(r.output.get(&0).unwrap(), &data[299_995..]);
    let r = h.call(json!({"op": "file_read", "path": p(&target), "range": {"first": 300_000}}));
    assert!(r.events.is_empty());
    assert_eq!(code(&r.ok()), Some("invalid_range"));
    let r = h.call(json!({"op": "file_read", "path": p(&outside)}));
    assert_eq!(code(&r.ok()), Some("is_a_directory"));
    let r = h.call(json!({"op": "file_read", "path": "relative/x"}));
    assert_eq!(code(&r.ok()), Some("invalid_path"));
    let r = h.call(json!({"op": "file_read", "path": "/a/../b"}));
    assert_eq!(code(&r.ok()), Some("invalid_path"));
}

#[test]
fn the_service_directory_is_out_of_reach_under_any_name() {
    let (_d, mut h, outside, service) = setup_anywhere();
    symlink(&service, outside.join("link")).unwrap();
    for path in [
        p(&service.join("environment")),
        p(&outside.join("link/environment")),
        format!("/proc/self/root{}", p(&service.join("environment"))),
    ] {
        let r = h.call(json!({"op": "file_read", "path": path}));
        assert_eq!(code(&r.ok()), Some("permission_denied"), "{path}");
        assert!(r.output.is_empty());
    }
    let r = h.with_input(
        json!({"op": "file_write", "path": p(&outside.join("link/planted")), "max_bytes": 9}),
        b"x",
        1,
    );
    assert_eq!(code(&r.ok()), Some("permission_denied"));
    assert!(!service.join("planted").exists());
    let v = h.fs(json!({"op": "move", "source": p(&outside.join("link")), "destination": p(&outside.join("l2"))}));
    assert_eq!(
        v["error"],
        Value::Null,
        "moving the link itself is fine: {v}"
    );
    std::fs::write(outside.join("f"), b"f").unwrap();
    let v = h.fs(json!({"op": "move", "source": p(&outside.join("f")), "destination": p(&service.join("f"))}));
    assert_eq!(code(&v), Some("permission_denied"));
    let v = h.fs(json!({"op": "stat", "path": p(&service)}));
    assert_eq!(code(&v), Some("permission_denied"));
    // A listing of its parent names it but never enters it.
    let v = h.fs(json!({"op": "list", "path": p(service.parent().unwrap()), "depth": 3}));
    let paths: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&p(&service).as_str()), "{paths:?}");
    assert!(
        !paths.iter().any(|x| x.contains("environment")),
        "{paths:?}"
    );
}

#[test]
fn stat_mkdir_move_and_deep_listing() {
    let (_d, mut h, outside, _service) = setup_anywhere();
    std::fs::write(outside.join("a.txt"), b"hello").unwrap();
    symlink("a.txt", outside.join("ln")).unwrap();
    let v = h.fs(json!({"op": "stat", "path": p(&outside.join("a.txt"))}));
    let e = &v["entry"];
    assert_eq!(e["name"], "a.txt");
    assert_eq!(e["type"], "file");
    assert_eq!(e["size"], 5);
    assert!(e["permissions"].as_str().unwrap().starts_with("-rw"));
    assert!(e["mtime"].as_i64().unwrap() > 0);
    assert!(e["owner"].is_string() && e["group"].is_string());
    let v = h.fs(json!({"op": "stat", "path": p(&outside.join("ln"))}));
    assert_eq!(v["entry"]["type"], "symlink");
    assert_eq!(v["entry"]["symlink_target"], "a.txt");
    let v = h.fs(json!({"op": "stat", "path": p(&outside.join("missing"))}));
    assert_eq!(code(&v), Some("not_found"));

    let v = h.fs(json!({"op": "mkdir", "path": p(&outside.join("x/y/z"))}));
    assert_eq!(code(&v), Some("not_found"), "{v}");
    let v = h.fs(json!({"op": "mkdir", "path": p(&outside.join("x/y/z")), "parents": true}));
    assert_eq!(v, json!({"ok": true, "created": true, "error": null}));
    let v = h.fs(json!({"op": "mkdir", "path": p(&outside.join("x/y/z")), "parents": true}));
    assert_eq!(v["created"], false);
    let v = h.fs(json!({"op": "mkdir", "path": p(&outside.join("x/y/z"))}));
    assert_eq!(code(&v), Some("already_exists"));

    std::fs::write(outside.join("x/y/z/f"), b"1").unwrap();
    let v = h.fs(json!({"op": "move", "source": p(&outside.join("a.txt")), "destination": p(&outside.join("x/b.txt"))}));
    assert_eq!(v, json!({"ok": true, "error": null}));
    assert_eq!(std::fs::read(outside.join("x/b.txt")).unwrap(), b"hello");
    std::fs::create_dir(outside.join("empty")).unwrap();
    let v = h.fs(json!({"op": "move", "source": p(&outside.join("empty")), "destination": p(&outside.join("x/y"))}));
    assert_eq!(code(&v), Some("not_empty"), "{v}");
    let v = h.fs(json!({"op": "move", "source": p(&outside.join("nope")), "destination": p(&outside.join("q"))}));
    assert_eq!(code(&v), Some("not_found"));

    let v = h.fs(json!({"op": "list", "path": p(&outside.join("x")), "depth": 2}));
    let paths: Vec<String> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect();
    let x = p(&outside.join("x"));
    assert_eq!(
        paths,
        vec![format!("{x}/b.txt"), format!("{x}/y"), format!("{x}/y/z")]
    );
    assert_eq!(v["truncated"], false);
    // The workspace is reachable by its wire name too.
    let v = h.fs(json!({"op": "mkdir", "path": "/workspace/made"}));
    assert_eq!(v["ok"], true, "{v}");
}

// === watch (protocol 4) ===

/// The next `change` (or `overflow`) event of watch `id`, as `(change, path, has_entry)`.
fn next_change(h: &mut Helper, id: u32) -> (String, String, bool) {
    let f = h
        .next_for(id, Duration::from_secs(10))
        .expect("a change within 10 s");
    assert_eq!(
        f.kind,
        kind::EVENT,
        "{:?}",
        String::from_utf8_lossy(&f.payload)
    );
    let v: Value = serde_json::from_slice(&f.payload).unwrap();
    (
        v["change"]
            .as_str()
            .unwrap_or(v["type"].as_str().unwrap())
            .to_string(),
        v["path"].as_str().unwrap_or_default().to_string(),
        v["entry"].is_object(),
    )
}

#[test]
fn a_watch_is_armed_then_sees_every_change_below_it_until_cancelled() {
    let (_d, mut h, outside, service) = setup_anywhere();
    let root = outside.join("w");
    std::fs::create_dir_all(root.join("old/deeper")).unwrap();
    let id = h.request(&json!({"op": "watch", "path": p(&root), "recursive": true}));
    let armed = h.next_for(id, Duration::from_secs(10)).expect("armed");
    let v: Value = serde_json::from_slice(&armed.payload).unwrap();
    assert_eq!(v, json!({"type": "armed", "watches": 3}));

    std::fs::write(root.join("a.txt"), b"one").unwrap();
    assert_eq!(
        next_change(&mut h, id),
        ("create".into(), p(&root.join("a.txt")), true)
    );
    assert_eq!(
        next_change(&mut h, id),
        ("write".into(), p(&root.join("a.txt")), true)
    );
    // A file in a directory that existed at arming.
    std::fs::write(root.join("old/deeper/x"), b"").unwrap();
    assert_eq!(next_change(&mut h, id).1, p(&root.join("old/deeper/x")));
    // A new directory is watched as it appears.
    std::fs::create_dir(root.join("new")).unwrap();
    assert_eq!(
        next_change(&mut h, id),
        ("create".into(), p(&root.join("new")), true)
    );
    std::fs::write(root.join("new/b"), b"").unwrap();
    assert_eq!(next_change(&mut h, id).1, p(&root.join("new/b")));
    std::fs::rename(root.join("a.txt"), root.join("c.txt")).unwrap();
    assert_eq!(
        next_change(&mut h, id),
        ("rename".into(), p(&root.join("a.txt")), false)
    );
    assert_eq!(
        next_change(&mut h, id),
        ("create".into(), p(&root.join("c.txt")), true)
    );
    std::fs::set_permissions(
        root.join("c.txt"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    assert_eq!(next_change(&mut h, id).0, "chmod");
    std::fs::remove_file(root.join("c.txt")).unwrap();
    assert_eq!(
        next_change(&mut h, id),
        ("remove".into(), p(&root.join("c.txt")), false)
    );
    h.send(id, kind::CANCEL, b"");
    let r = h.collect(id, Duration::from_secs(10));
    assert_eq!(r.err_kind(), "cancelled");
    // Refused before arming: a missing path, a file, the service directory.
    for (path, want) in [
        (p(&outside.join("missing")), "not_found"),
        (p(&root.join("old/deeper/x")), "not_a_directory"),
        (p(&service), "permission_denied"),
    ] {
        let r = h.call(json!({"op": "watch", "path": path}));
        assert!(r.events.is_empty(), "{path}: {:?}", r.events);
        assert_eq!(code(&r.ok()), Some(want), "{path}");
    }
}

/// A directory filled while it appears: what its scan finds and what the kernel reports of the
/// same creations are one change each, never two, and none is missed.
#[test]
fn a_directory_filled_as_it_appears_reports_each_entry_once() {
    let (_d, mut h, outside, _service) = setup_anywhere();
    let root = outside.join("race");
    std::fs::create_dir(&root).unwrap();
    let id = h.request(&json!({"op": "watch", "path": p(&root), "recursive": true}));
    assert_eq!(next_change(&mut h, id).0, "armed");
    let mut want = std::collections::BTreeSet::new();
    for d in 0..20 {
        let dir = root.join(format!("d{d}"));
        std::fs::create_dir(&dir).unwrap();
        want.insert(p(&dir));
        for f in 0..25 {
            let file = dir.join(format!("f{f}"));
            std::fs::File::create(&file).unwrap();
            want.insert(p(&file));
        }
    }
    let mut seen = std::collections::BTreeMap::<String, u32>::new();
    while seen.len() < want.len() {
        let (change, path, _) = next_change(&mut h, id);
        assert_eq!(change, "create", "{path}");
        *seen.entry(path).or_default() += 1;
    }
    // Anything still queued (a duplicate) arrives well within this.
    if let Some(f) = h.next_for(id, Duration::from_millis(500)) {
        let v: Value = serde_json::from_slice(&f.payload).unwrap();
        panic!("after every create: {v}");
    }
    assert_eq!(
        seen.keys()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>(),
        want
    );
    assert!(seen.values().all(|n| *n == 1), "{seen:?}");
    h.send(id, kind::CANCEL, b"");
}

#[test]
fn a_watched_directory_that_goes_ends_its_watch() {
    let (_d, mut h, outside, _service) = setup_anywhere();
    let root = outside.join("gone");
    std::fs::create_dir(&root).unwrap();
    let id = h.request(&json!({"op": "watch", "path": p(&root)}));
    assert_eq!(next_change(&mut h, id).0, "armed");
    std::fs::remove_dir(&root).unwrap();
    assert_eq!(next_change(&mut h, id), ("remove".into(), p(&root), false));
    let r = h.collect(id, Duration::from_secs(10));
    assert_eq!(r.ok()["bytes"], 1);
}

/// Issue 35: a move across filesystems (the workspace volume and the container's own layer) of
/// a file copies it beside the destination, renames it over, and removes the source; a
/// directory is refused with a message that says what to do.
#[test]
fn a_file_moves_across_filesystems_a_directory_is_refused_clearly() {
    use std::os::unix::fs::MetadataExt;
    let (_d, mut h, outside, _service) = setup_anywhere();
    let shm = tempfile::tempdir_in("/dev/shm").expect("a tmpfs at /dev/shm");
    assert_ne!(
        std::fs::metadata(shm.path()).unwrap().dev(),
        std::fs::metadata(&outside).unwrap().dev(),
        "the test needs two filesystems"
    );
    let src = shm.path().join("a.bin");
    let content: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&src, &content).unwrap();
    std::fs::set_permissions(&src, std::os::unix::fs::PermissionsExt::from_mode(0o750)).unwrap();
    std::fs::write(outside.join("b.bin"), b"old").unwrap();
    let v =
        h.fs(json!({"op": "move", "source": p(&src), "destination": p(&outside.join("b.bin"))}));
    assert_eq!(code(&v), None, "{v}");
    assert_eq!(std::fs::read(outside.join("b.bin")).unwrap(), content);
    assert_eq!(
        std::fs::metadata(outside.join("b.bin")).unwrap().mode() & 0o777,
        0o750
    );
    assert!(!src.exists());
    // No temporary file left beside it.
    let names: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| !n.to_string_lossy().contains("daiv-move")),
        "{names:?}"
    );
    let dir = shm.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    let v = h.fs(json!({"op": "move", "source": p(&dir), "destination": p(&outside.join("d"))}));
    assert_eq!(code(&v), Some("exec_failed"), "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("mv"),
        "{v}"
    );
    assert!(dir.exists());
}
