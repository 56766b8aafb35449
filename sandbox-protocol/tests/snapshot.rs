//! The protocol's JSON, pinned: every request (and process request) variant, every event, the
//! response envelope with every error kind, every `ok` value the protocol defines, the
//! `write-file` header, the fs answers and the bytes of a frame. Each literal is what one side
//! sends and the other parses; a change to any of them (a renamed field, a new default, a new
//! variant) fails here, so it is never silent. A new variant does not compile until it is named
//! in the lists below, and a named variant without a pinned literal fails.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::fmt::Debug;

use sandbox_protocol::files::{
    EntryType, FileAnswer, FileEntry, FsListResponse, FsMkdirResponse, FsMoveResponse,
    FsStatResponse,
};
use sandbox_protocol::frame::{self, kind};
use sandbox_protocol::message::ByteRange;
use sandbox_protocol::message::{
    ChangeKind, DiskInfo, ErrorKind, Event, ExtractStats, PollInfo, ProcEvent, ProcEvents,
    ProcInfo, ProcList, ProcRequest, ProcStarted, PtySize, Request, Response, SeededInfo, Usage,
};
use sandbox_protocol::wire::{
    FsDeleteResponse, FsEditResponse, FsEntry, FsError, FsErrorCode, FsGlobResponse, FsGrepMatch,
    FsGrepResponse, FsLsResponse, FsReadResponse, FsWriteResponse,
};
use sandbox_protocol::write_file::{self, WriteHeader};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// `value` is sent as exactly `json`, and `json` is read back as exactly `value`.
fn pinned<T: Serialize + DeserializeOwned + PartialEq + Debug>(value: &T, json: &str) {
    assert_eq!(
        serde_json::to_string(value).unwrap(),
        json,
        "{value:?} is sent differently"
    );
    assert_eq!(
        &serde_json::from_str::<T>(json).unwrap(),
        value,
        "{json} is read differently"
    );
}

/// `value` is sent as exactly `json` (answers the control plane only reads).
fn sent_as<T: Serialize>(value: &T, json: &str) {
    assert_eq!(serde_json::to_string(value).unwrap(), json);
}

fn covers(pinned: impl IntoIterator<Item = &'static str>, all: &[&'static str]) {
    let pinned: BTreeSet<_> = pinned.into_iter().collect();
    let all: BTreeSet<_> = all.iter().copied().collect();
    assert_eq!(pinned, all, "every variant has a pinned literal");
}

fn request_name(r: &Request) -> &'static str {
    match r {
        Request::Ping => "ping",
        Request::Seeded => "seeded",
        Request::Disk => "disk",
        Request::Run { .. } => "run",
        Request::Ls { .. } => "ls",
        Request::Read { .. } => "read",
        Request::Grep { .. } => "grep",
        Request::Glob { .. } => "glob",
        Request::Write { .. } => "write",
        Request::Edit { .. } => "edit",
        Request::Delete { .. } => "delete",
        Request::Extract { .. } => "extract",
        Request::Clear { .. } => "clear",
        Request::Proc { .. } => "proc",
        Request::Stat { .. } => "stat",
        Request::Mkdir { .. } => "mkdir",
        Request::Move { .. } => "move",
        Request::List { .. } => "list",
        Request::FileRead { .. } => "file_read",
        Request::FileWrite { .. } => "file_write",
        Request::Watch { .. } => "watch",
        Request::Connect { .. } => "connect",
    }
}

const REQUESTS: &[&str] = &[
    "ping",
    "seeded",
    "disk",
    "run",
    "ls",
    "read",
    "grep",
    "glob",
    "write",
    "edit",
    "delete",
    "extract",
    "clear",
    "proc",
    "stat",
    "mkdir",
    "move",
    "list",
    "file_read",
    "file_write",
    "watch",
    "connect",
];

fn path(p: &str) -> String {
    format!("/workspace/repo/{p}")
}

#[test]
fn every_request_has_its_json() {
    let cases: Vec<(Request, &str)> = vec![
        (Request::Ping, r#"{"op":"ping"}"#),
        (Request::Seeded, r#"{"op":"seeded"}"#),
        (Request::Disk, r#"{"op":"disk"}"#),
        (
            Request::Run {
                commands: vec!["make test".into(), "echo done".into()],
                fail_fast: true,
                timeout_ms: Some(600_000),
                output_cap: 1024,
                workdir: "/workspace/repo/sub".into(),
                env: vec![("CI".into(), "1".into())],
                split: false,
            },
            r#"{"op":"run","commands":["make test","echo done"],"fail_fast":true,"timeout_ms":600000,"output_cap":1024,"workdir":"/workspace/repo/sub","env":[["CI","1"]]}"#,
        ),
        (
            Request::Run {
                commands: vec!["echo a; echo b >&2".into()],
                fail_fast: false,
                timeout_ms: None,
                output_cap: 1024,
                workdir: "/workspace/repo".into(),
                env: vec![],
                split: true,
            },
            r#"{"op":"run","commands":["echo a; echo b >&2"],"fail_fast":false,"timeout_ms":null,"output_cap":1024,"workdir":"/workspace/repo","env":[],"split":true}"#,
        ),
        (
            Request::Ls {
                path: path("src"),
                max_bytes: 67_108_864,
                deadline_ms: 30_000,
            },
            r#"{"op":"ls","path":"/workspace/repo/src","max_bytes":67108864,"deadline_ms":30000}"#,
        ),
        (
            Request::Read {
                path: path("a.rs"),
                offset: 10,
                limit: 20,
                deadline_ms: 5_000,
            },
            r#"{"op":"read","path":"/workspace/repo/a.rs","offset":10,"limit":20,"deadline_ms":5000}"#,
        ),
        (
            Request::Grep {
                pattern: "fn [a-z]+".into(),
                path: path(""),
                glob: Some("*.rs".into()),
                prune: vec![".git".into(), "node_modules".into()],
                deadline_ms: 30_000,
            },
            r#"{"op":"grep","pattern":"fn [a-z]+","path":"/workspace/repo/","glob":"*.rs","prune":[".git","node_modules"],"deadline_ms":30000}"#,
        ),
        (
            Request::Glob {
                pattern: "**/*.rs".into(),
                path: path(""),
                prune: vec![".git".into()],
                max_bytes: 1_000,
                deadline_ms: 30_000,
            },
            r#"{"op":"glob","pattern":"**/*.rs","path":"/workspace/repo/","prune":[".git"],"max_bytes":1000,"deadline_ms":30000}"#,
        ),
        (
            Request::Write {
                path: path("new.sh"),
                mode: 0o755,
                deadline_ms: 30_000,
            },
            r#"{"op":"write","path":"/workspace/repo/new.sh","mode":493,"deadline_ms":30000}"#,
        ),
        (
            Request::Edit {
                path: path("a.rs"),
                old: "foo".into(),
                new: "bar".into(),
                replace_all: true,
                deadline_ms: 30_000,
            },
            r#"{"op":"edit","path":"/workspace/repo/a.rs","old":"foo","new":"bar","replace_all":true,"deadline_ms":30000}"#,
        ),
        (
            Request::Delete {
                path: path("a.rs"),
                deadline_ms: 30_000,
            },
            r#"{"op":"delete","path":"/workspace/repo/a.rs","deadline_ms":30000}"#,
        ),
        (
            Request::Extract {
                dest: "/workspace/repo".into(),
                deadline_ms: None,
            },
            r#"{"op":"extract","dest":"/workspace/repo","deadline_ms":null}"#,
        ),
        (
            Request::Clear {
                dest: "/workspace/skills".into(),
                deadline_ms: Some(120_000),
            },
            r#"{"op":"clear","dest":"/workspace/skills","deadline_ms":120000}"#,
        ),
        (
            Request::Proc {
                request: ProcRequest::List,
            },
            r#"{"op":"proc","request":{"action":"list"}}"#,
        ),
        (
            Request::Stat {
                path: "/etc/hosts".into(),
                deadline_ms: 30_000,
            },
            r#"{"op":"stat","path":"/etc/hosts","deadline_ms":30000}"#,
        ),
        (
            Request::Mkdir {
                path: "/tmp/a/b".into(),
                parents: true,
                deadline_ms: 30_000,
            },
            r#"{"op":"mkdir","path":"/tmp/a/b","parents":true,"deadline_ms":30000}"#,
        ),
        (
            Request::Move {
                source: "/tmp/a".into(),
                destination: "/home/sandbox/a".into(),
                deadline_ms: 30_000,
            },
            r#"{"op":"move","source":"/tmp/a","destination":"/home/sandbox/a","deadline_ms":30000}"#,
        ),
        (
            Request::List {
                path: "/tmp".into(),
                depth: 2,
                deadline_ms: 30_000,
            },
            r#"{"op":"list","path":"/tmp","depth":2,"deadline_ms":30000}"#,
        ),
        (
            Request::FileRead {
                path: "/tmp/big".into(),
                range: Some(ByteRange {
                    first: None,
                    last: Some(500),
                }),
            },
            r#"{"op":"file_read","path":"/tmp/big","range":{"first":null,"last":500}}"#,
        ),
        (
            Request::FileWrite {
                path: "/tmp/big".into(),
                mode: None,
                parents: false,
                max_bytes: 1_073_741_824,
                in_place: false,
                metadata: None,
            },
            r#"{"op":"file_write","path":"/tmp/big","mode":null,"parents":false,"max_bytes":1073741824}"#,
        ),
        (
            Request::FileWrite {
                path: "/tmp/watched".into(),
                mode: Some(0o600),
                parents: true,
                max_bytes: 1024,
                in_place: true,
                metadata: None,
            },
            r#"{"op":"file_write","path":"/tmp/watched","mode":384,"parents":true,"max_bytes":1024,"in_place":true}"#,
        ),
        (
            Request::FileWrite {
                path: "/tmp/tagged".into(),
                mode: None,
                parents: true,
                max_bytes: 1024,
                in_place: true,
                metadata: Some([("author".to_string(), "mish".to_string())].into()),
            },
            r#"{"op":"file_write","path":"/tmp/tagged","mode":null,"parents":true,"max_bytes":1024,"in_place":true,"metadata":{"author":"mish"}}"#,
        ),
        (
            Request::Watch {
                path: "/workspace/repo".into(),
                recursive: true,
            },
            r#"{"op":"watch","path":"/workspace/repo","recursive":true}"#,
        ),
        (
            Request::Connect {
                port: 8080,
                window: 262_144,
            },
            r#"{"op":"connect","port":8080,"window":262144}"#,
        ),
    ];
    for (value, json) in &cases {
        pinned(value, json);
    }
    covers(cases.iter().map(|(r, _)| request_name(r)), REQUESTS);
}

/// What a request leaves out is the protocol's default, on the helper's side.
#[test]
fn omitted_request_fields_take_their_defaults() {
    let read = |json: &str| serde_json::from_str::<Request>(json).unwrap();
    assert_eq!(
        read(r#"{"op":"run","commands":["true"]}"#),
        Request::Run {
            commands: vec!["true".into()],
            fail_fast: false,
            timeout_ms: None,
            output_cap: 16 * 1024 * 1024,
            workdir: "/workspace/repo".into(),
            env: vec![],
            split: false,
        }
    );
    assert_eq!(
        read(r#"{"op":"read","path":"/workspace/a"}"#),
        Request::Read {
            path: "/workspace/a".into(),
            offset: 0,
            limit: 2000,
            deadline_ms: 30_000,
        }
    );
    assert_eq!(
        read(r#"{"op":"grep","pattern":"x","path":"/workspace"}"#),
        Request::Grep {
            pattern: "x".into(),
            path: "/workspace".into(),
            glob: None,
            prune: vec![],
            deadline_ms: 30_000,
        }
    );
    assert_eq!(
        read(r#"{"op":"write","path":"/workspace/a"}"#),
        Request::Write {
            path: "/workspace/a".into(),
            mode: 0o644,
            deadline_ms: 30_000,
        }
    );
    assert_eq!(
        read(r#"{"op":"edit","path":"/workspace/a","old":"x","new":"y"}"#),
        Request::Edit {
            path: "/workspace/a".into(),
            old: "x".into(),
            new: "y".into(),
            replace_all: false,
            deadline_ms: 30_000,
        }
    );
    assert_eq!(
        read(r#"{"op":"extract","dest":"/workspace/repo"}"#),
        Request::Extract {
            dest: "/workspace/repo".into(),
            deadline_ms: None,
        }
    );
    for bad in [
        r#"{"op":"format_disk"}"#,
        r#"{"op":"ls"}"#,
        r#"{"path":"/workspace"}"#,
    ] {
        assert!(serde_json::from_str::<Request>(bad).is_err(), "{bad}");
    }
}

fn proc_name(r: &ProcRequest) -> &'static str {
    match r {
        ProcRequest::Start { .. } => "start",
        ProcRequest::List => "list",
        ProcRequest::Poll { .. } => "poll",
        ProcRequest::Stdin { .. } => "stdin",
        ProcRequest::Kill { .. } => "kill",
        ProcRequest::Events { .. } => "events",
        ProcRequest::Signal { .. } => "signal",
        ProcRequest::Resize { .. } => "resize",
    }
}

#[test]
fn every_process_request_has_its_json() {
    let cases: Vec<(ProcRequest, &str)> = vec![
        (
            ProcRequest::Start {
                command: "npm run dev".into(),
                workdir: "/workspace/repo".into(),
                env: vec![("PORT".into(), "3000".into())],
                max_live: 8,
                buffer_bytes: 1_048_576,
                process_id: None,
                tag: None,
                pty: None,
            },
            r#"{"action":"start","command":"npm run dev","workdir":"/workspace/repo","env":[["PORT","3000"]],"max_live":8,"buffer_bytes":1048576}"#,
        ),
        (
            ProcRequest::Start {
                command: "npm run dev".into(),
                workdir: "/srv".into(),
                env: vec![],
                max_live: 8,
                buffer_bytes: 1_048_576,
                process_id: Some("dev-server".into()),
                tag: Some("web".into()),
                pty: Some(PtySize { cols: 80, rows: 24 }),
            },
            r#"{"action":"start","command":"npm run dev","workdir":"/srv","env":[],"max_live":8,"buffer_bytes":1048576,"process_id":"dev-server","tag":"web","pty":{"cols":80,"rows":24}}"#,
        ),
        (
            ProcRequest::Resize {
                process_id: "dev-server".into(),
                size: PtySize {
                    cols: 120,
                    rows: 40,
                },
            },
            r#"{"action":"resize","process_id":"dev-server","size":{"cols":120,"rows":40}}"#,
        ),
        (
            ProcRequest::Events {
                process_id: "dev-server".into(),
                after: Some(3),
                wait_ms: 10_000,
                max_bytes: 65_536,
            },
            r#"{"action":"events","process_id":"dev-server","after":3,"wait_ms":10000,"max_bytes":65536}"#,
        ),
        (
            ProcRequest::Signal {
                process_id: "dev-server".into(),
                signal: "TERM".into(),
            },
            r#"{"action":"signal","process_id":"dev-server","signal":"TERM"}"#,
        ),
        (ProcRequest::List, r#"{"action":"list"}"#),
        (
            ProcRequest::Poll {
                process_id: "p1-0a1b2c3d4e5f".into(),
                offset: 100,
                wait_ms: 2_000,
                max_bytes: 65_536,
            },
            r#"{"action":"poll","process_id":"p1-0a1b2c3d4e5f","offset":100,"wait_ms":2000,"max_bytes":65536}"#,
        ),
        (
            ProcRequest::Stdin {
                process_id: "p1-0a1b2c3d4e5f".into(),
                eof: true,
            },
            r#"{"action":"stdin","process_id":"p1-0a1b2c3d4e5f","eof":true}"#,
        ),
        (
            ProcRequest::Kill {
                process_id: "p1-0a1b2c3d4e5f".into(),
            },
            r#"{"action":"kill","process_id":"p1-0a1b2c3d4e5f"}"#,
        ),
    ];
    for (value, json) in &cases {
        pinned(value, json);
    }
    covers(
        cases.iter().map(|(r, _)| proc_name(r)),
        &[
            "start", "list", "poll", "stdin", "kill", "events", "signal", "resize",
        ],
    );
    // Wrapped in a REQUEST, and with its defaults left out.
    pinned(
        &Request::Proc {
            request: ProcRequest::Kill {
                process_id: "p2-ffffffffffff".into(),
            },
        },
        r#"{"op":"proc","request":{"action":"kill","process_id":"p2-ffffffffffff"}}"#,
    );
    assert_eq!(
        serde_json::from_str::<ProcRequest>(r#"{"action":"poll","process_id":"p","max_bytes":1}"#)
            .unwrap(),
        ProcRequest::Poll {
            process_id: "p".into(),
            offset: 0,
            wait_ms: 0,
            max_bytes: 1,
        }
    );
    assert_eq!(
        serde_json::from_str::<ProcRequest>(
            r#"{"action":"start","command":"x","workdir":"/w","max_live":1,"buffer_bytes":1}"#
        )
        .unwrap(),
        ProcRequest::Start {
            command: "x".into(),
            workdir: "/w".into(),
            env: vec![],
            max_live: 1,
            buffer_bytes: 1,
            process_id: None,
            tag: None,
            pty: None,
        }
    );
}

#[test]
fn process_events_have_their_json() {
    let cases: Vec<(ProcEvents, &str)> = vec![(
        ProcEvents {
            events: vec![
                ProcEvent::Start { seq: 1, pid: 42 },
                ProcEvent::Stdout { seq: 2, len: 2 },
                ProcEvent::Stderr { seq: 3, len: 2 },
                ProcEvent::End {
                    seq: 4,
                    exit_code: 143,
                    signal: Some("TERM".into()),
                    usage: Usage {
                        duration_ms: Some(5),
                        cpu_ms: None,
                        max_rss_bytes: None,
                    },
                },
            ],
            last_seq: 4,
        },
        r#"{"events":[{"type":"start","seq":1,"pid":42},{"type":"stdout","seq":2,"len":2},{"type":"stderr","seq":3,"len":2},{"type":"end","seq":4,"exit_code":143,"signal":"TERM","duration_ms":5}],"last_seq":4}"#,
    )];
    for (value, json) in &cases {
        pinned(value, json);
    }
    pinned(
        &ProcStarted {
            process_id: "dev-server".into(),
            existing: true,
        },
        r#"{"process_id":"dev-server","existing":true}"#,
    );
}

fn event_name(e: &Event) -> &'static str {
    match e {
        Event::Ready { .. } => "ready",
        Event::Started { .. } => "started",
        Event::Finished { .. } => "finished",
        Event::File { .. } => "file",
        Event::Armed { .. } => "armed",
        Event::Change { .. } => "change",
        Event::Overflow => "overflow",
        Event::Listing { .. } => "listing",
        Event::Connected { .. } => "connected",
    }
}

#[test]
fn every_event_has_its_json() {
    let cases: Vec<(Event, &str)> = vec![
        (
            Event::Ready {
                protocol: 2,
                version: "0.1.0".into(),
                pid: 42,
            },
            r#"{"type":"ready","protocol":2,"version":"0.1.0","pid":42}"#,
        ),
        (
            Event::Started { index: 0 },
            r#"{"type":"started","index":0}"#,
        ),
        (
            Event::Finished {
                index: 1,
                exit_code: 124,
                omitted: 4096,
                timed_out: true,
                usage: Usage::default(),
            },
            r#"{"type":"finished","index":1,"exit_code":124,"omitted":4096,"timed_out":true}"#,
        ),
        (
            Event::Finished {
                index: 0,
                exit_code: 0,
                omitted: 0,
                timed_out: false,
                usage: Usage {
                    duration_ms: Some(12),
                    cpu_ms: Some(7),
                    max_rss_bytes: Some(3_145_728),
                },
            },
            r#"{"type":"finished","index":0,"exit_code":0,"omitted":0,"timed_out":false,"duration_ms":12,"cpu_ms":7,"max_rss_bytes":3145728}"#,
        ),
        (
            Event::File {
                size: 1000,
                start: 500,
                length: 500,
            },
            r#"{"type":"file","size":1000,"start":500,"length":500}"#,
        ),
        (
            Event::Armed { watches: 3 },
            r#"{"type":"armed","watches":3}"#,
        ),
        (
            Event::Change {
                change: ChangeKind::Rename,
                path: "/workspace/repo/a".into(),
                entry: None,
            },
            r#"{"type":"change","change":"rename","path":"/workspace/repo/a"}"#,
        ),
        (Event::Overflow, r#"{"type":"overflow"}"#),
        (
            Event::Listing {
                entries: 5000,
                bytes: 290_000,
            },
            r#"{"type":"listing","entries":5000,"bytes":290000}"#,
        ),
        (
            Event::Connected { window: 262_144 },
            r#"{"type":"connected","window":262144}"#,
        ),
    ];
    for (value, json) in &cases {
        pinned(value, json);
    }
    covers(
        cases.iter().map(|(e, _)| event_name(e)),
        &[
            "ready",
            "started",
            "finished",
            "file",
            "armed",
            "change",
            "overflow",
            "listing",
            "connected",
        ],
    );
}

fn kind_name(k: ErrorKind) -> &'static str {
    match k {
        ErrorKind::BadRequest => "bad_request",
        ErrorKind::Cancelled => "cancelled",
        ErrorKind::Deadline => "deadline",
        ErrorKind::Io => "io",
        ErrorKind::Internal => "internal",
        ErrorKind::NotFound => "not_found",
        ErrorKind::Conflict => "conflict",
        ErrorKind::Limit => "limit",
        ErrorKind::Gone => "gone",
        ErrorKind::Refused => "refused",
    }
}

#[test]
fn responses_and_every_error_kind_have_their_json() {
    pinned(&Response::empty(), r#"{"ok":{}}"#);
    pinned(
        &Response::ok(&SeededInfo { seeded: true }),
        r#"{"ok":{"seeded":true}}"#,
    );
    let kinds = [
        ErrorKind::BadRequest,
        ErrorKind::Cancelled,
        ErrorKind::Deadline,
        ErrorKind::Io,
        ErrorKind::Internal,
        ErrorKind::NotFound,
        ErrorKind::Conflict,
        ErrorKind::Limit,
        ErrorKind::Gone,
        ErrorKind::Refused,
    ];
    for k in kinds {
        let name = kind_name(k);
        pinned(&k, &format!("\"{name}\""));
        pinned(
            &Response::error(k, "why"),
            &format!(r#"{{"error":{{"kind":"{name}","message":"why"}}}}"#),
        );
    }
    covers(
        kinds.into_iter().map(kind_name),
        &[
            "bad_request",
            "cancelled",
            "deadline",
            "io",
            "internal",
            "not_found",
            "conflict",
            "limit",
            "gone",
            "refused",
        ],
    );
    // The client reads the envelope once and the `ok` value later, as the op's own type.
    let raw: Response<Box<serde_json::value::RawValue>> =
        serde_json::from_str(r#"{"ok":{"seeded":false}}"#).unwrap();
    let Response::Ok(ok) = raw else {
        panic!("an ok response")
    };
    assert_eq!(
        serde_json::from_str::<SeededInfo>(ok.get()).unwrap(),
        SeededInfo { seeded: false }
    );
    assert_eq!(
        Response::ok(&ExtractStats {
            files: 1,
            ..Default::default()
        })
        .into_result::<ExtractStats>()
        .unwrap()
        .files,
        1
    );
    assert!(matches!(
        Response::empty().into_result::<SeededInfo>(),
        Err(e) if e.kind == ErrorKind::Internal
    ));
}

#[test]
fn every_ok_value_has_its_json() {
    pinned(
        &ExtractStats {
            files: 3,
            dirs: 2,
            symlinks: 1,
            bytes: 1234,
            skipped: 1,
        },
        r#"{"files":3,"dirs":2,"symlinks":1,"bytes":1234,"skipped":1}"#,
    );
    // `skipped` came later: a helper that does not send it reads as none skipped.
    assert_eq!(
        serde_json::from_str::<ExtractStats>(r#"{"files":3,"dirs":2,"symlinks":1,"bytes":1234}"#)
            .unwrap()
            .skipped,
        0
    );
    pinned(&SeededInfo { seeded: false }, r#"{"seeded":false}"#);
    pinned(
        &DiskInfo {
            total_bytes: 10,
            used_bytes: 4,
        },
        r#"{"total_bytes":10,"used_bytes":4}"#,
    );
    pinned(
        &ProcStarted {
            process_id: "p1-0a1b2c3d4e5f".into(),
            existing: false,
        },
        r#"{"process_id":"p1-0a1b2c3d4e5f"}"#,
    );
    pinned(
        &ProcList {
            processes: vec![
                ProcInfo {
                    process_id: "p1-0a1b2c3d4e5f".into(),
                    command: "npm run dev".into(),
                    pid: Some(17),
                    tag: Some("web".into()),
                    pty: true,
                    running: true,
                    exit_code: None,
                    usage: Usage::default(),
                },
                ProcInfo {
                    process_id: "p2-ffffffffffff".into(),
                    command: "sleep 1".into(),
                    pid: None,
                    tag: None,
                    pty: false,
                    running: false,
                    exit_code: Some(137),
                    usage: Usage {
                        duration_ms: Some(1002),
                        cpu_ms: Some(3),
                        max_rss_bytes: Some(1_048_576),
                    },
                },
            ],
        },
        r#"{"processes":[{"process_id":"p1-0a1b2c3d4e5f","command":"npm run dev","pid":17,"tag":"web","pty":true,"running":true,"exit_code":null},{"process_id":"p2-ffffffffffff","command":"sleep 1","running":false,"exit_code":137,"duration_ms":1002,"cpu_ms":3,"max_rss_bytes":1048576}]}"#,
    );
    pinned(
        &PollInfo {
            process_id: "p1-0a1b2c3d4e5f".into(),
            running: false,
            exit_code: Some(0),
            offset: 10,
            next_offset: 25,
            truncated: true,
            usage: Usage {
                duration_ms: Some(40),
                cpu_ms: None,
                max_rss_bytes: None,
            },
        },
        r#"{"process_id":"p1-0a1b2c3d4e5f","running":false,"exit_code":0,"offset":10,"next_offset":25,"truncated":true,"duration_ms":40}"#,
    );
}

#[test]
fn the_write_file_header_has_its_json() {
    pinned(
        &WriteHeader {
            len: 2,
            args: vec!["v7".into()],
        },
        r#"{"len":2,"args":["v7"]}"#,
    );
    assert_eq!(
        serde_json::from_str::<WriteHeader>(r#"{"len":2}"#).unwrap(),
        WriteHeader {
            len: 2,
            args: vec![]
        }
    );
    assert_eq!(
        WriteHeader::frame(b"[]", vec!["v7".into()]),
        b"{\"len\":2,\"args\":[\"v7\"]}\n[]".to_vec()
    );
}

#[test]
fn the_write_file_answer_has_its_lines() {
    // Sessions and gateways created by older versions print exactly these: they must keep
    // parsing.
    assert_eq!(write_file::WRITTEN, "ok");
    assert_eq!(write_file::exit_line(0), "exit 0");
    let answer = write_file::WriteAnswer::parse(b"ok\nexit 0\n");
    assert_eq!((answer.written, answer.exit), (true, Some(0)));
}

fn code_name(c: FsErrorCode) -> &'static str {
    match c {
        FsErrorCode::InvalidPath => "invalid_path",
        FsErrorCode::NotFound => "not_found",
        FsErrorCode::NotADirectory => "not_a_directory",
        FsErrorCode::IsADirectory => "is_a_directory",
        FsErrorCode::NotATextFile => "not_a_text_file",
        FsErrorCode::StringNotFound => "string_not_found",
        FsErrorCode::MultipleOccurrences => "multiple_occurrences",
        FsErrorCode::AlreadyExists => "already_exists",
        FsErrorCode::TooLarge => "too_large",
        FsErrorCode::InvalidOffset => "invalid_offset",
        FsErrorCode::PermissionDenied => "permission_denied",
        FsErrorCode::ExecFailed => "exec_failed",
        FsErrorCode::InvalidPattern => "invalid_pattern",
        FsErrorCode::NotEmpty => "not_empty",
        FsErrorCode::NoSpace => "no_space",
        FsErrorCode::InvalidRange => "invalid_range",
    }
}

/// The fs answers inside `ok`: the same JSON the HTTP API serves.
#[test]
fn fs_answers_have_their_json() {
    let codes = [
        FsErrorCode::InvalidPath,
        FsErrorCode::NotFound,
        FsErrorCode::NotADirectory,
        FsErrorCode::IsADirectory,
        FsErrorCode::NotATextFile,
        FsErrorCode::StringNotFound,
        FsErrorCode::MultipleOccurrences,
        FsErrorCode::AlreadyExists,
        FsErrorCode::TooLarge,
        FsErrorCode::InvalidOffset,
        FsErrorCode::PermissionDenied,
        FsErrorCode::ExecFailed,
        FsErrorCode::InvalidPattern,
        FsErrorCode::NotEmpty,
        FsErrorCode::NoSpace,
        FsErrorCode::InvalidRange,
    ];
    for c in codes {
        pinned(&c, &format!("\"{}\"", code_name(c)));
        assert_eq!(c.label(), code_name(c));
    }
    assert_eq!(codes.len(), 16, "every code is listed");
    // The data plane's answers.
    sent_as(
        &FsStatResponse {
            entry: Some(FileEntry {
                name: "hosts".into(),
                path: "/etc/hosts".into(),
                entry_type: EntryType::File,
                size: 174,
                mode: 0o644,
                permissions: "-rw-r--r--".into(),
                owner: "root".into(),
                group: "root".into(),
                mtime: 1_764_000_000,
                symlink_target: None,
                metadata: Default::default(),
            }),
            error: None,
        },
        r#"{"entry":{"name":"hosts","path":"/etc/hosts","type":"file","size":174,"mode":420,"permissions":"-rw-r--r--","owner":"root","group":"root","mtime":1764000000,"symlink_target":null},"error":null}"#,
    );
    // With metadata (E2B's `user.e2b.*` attributes), by key.
    sent_as(
        &FsStatResponse {
            entry: Some(FileEntry {
                name: "notes".into(),
                path: "/home/user/notes".into(),
                entry_type: EntryType::File,
                size: 3,
                mode: 0o644,
                permissions: "-rw-r--r--".into(),
                owner: "user".into(),
                group: "user".into(),
                mtime: 1_764_000_000,
                symlink_target: None,
                metadata: [("author".to_string(), "mish".to_string())].into(),
            }),
            error: None,
        },
        r#"{"entry":{"name":"notes","path":"/home/user/notes","type":"file","size":3,"mode":420,"permissions":"-rw-r--r--","owner":"user","group":"user","mtime":1764000000,"symlink_target":null,"metadata":{"author":"mish"}},"error":null}"#,
    );
    sent_as(
        &FsMkdirResponse {
            ok: true,
            created: false,
            error: None,
        },
        r#"{"ok":true,"created":false,"error":null}"#,
    );
    sent_as(
        &FsMoveResponse {
            ok: false,
            error: Some(FsError::new(
                FsErrorCode::NotEmpty,
                "/x: directory not empty",
            )),
        },
        r#"{"ok":false,"error":{"code":"not_empty","message":"/x: directory not empty"}}"#,
    );
    sent_as(
        &FsListResponse {
            entries: vec![],
            truncated: false,
            error: None,
        },
        r#"{"entries":[],"truncated":false,"error":null}"#,
    );
    pinned(
        &FileAnswer {
            bytes: 7,
            error: None,
        },
        r#"{"bytes":7,"error":null}"#,
    );
    let entry = FsEntry {
        path: path("src"),
        is_dir: true,
    };
    sent_as(
        &FsLsResponse {
            entries: vec![entry.clone()],
            error: None,
        },
        r#"{"entries":[{"path":"/workspace/repo/src","is_dir":true}],"error":null}"#,
    );
    sent_as(
        &FsReadResponse {
            content: Some("a\n".into()),
            encoding: Some("utf-8".into()),
            total_lines: Some(1),
            end_line: Some(1),
            truncated: false,
            error: None,
        },
        r#"{"content":"a\n","encoding":"utf-8","total_lines":1,"end_line":1,"truncated":false,"error":null}"#,
    );
    sent_as(
        &FsReadResponse {
            error: Some(FsError::new(
                FsErrorCode::NotFound,
                "/workspace/a does not exist",
            )),
            ..Default::default()
        },
        r#"{"content":null,"encoding":null,"total_lines":null,"end_line":null,"truncated":false,"error":{"code":"not_found","message":"/workspace/a does not exist"}}"#,
    );
    sent_as(
        &FsGrepResponse {
            matches: vec![FsGrepMatch {
                path: path("a.rs"),
                line: 3,
                text: "fn main() {".into(),
            }],
            truncated: true,
            error: None,
        },
        r#"{"matches":[{"path":"/workspace/repo/a.rs","line":3,"text":"fn main() {"}],"truncated":true,"error":null}"#,
    );
    sent_as(
        &FsGlobResponse {
            matches: vec![entry],
            error: None,
        },
        r#"{"matches":[{"path":"/workspace/repo/src","is_dir":true}],"error":null}"#,
    );
    sent_as(
        &FsWriteResponse {
            ok: true,
            error: None,
        },
        r#"{"ok":true,"error":null}"#,
    );
    sent_as(
        &FsEditResponse {
            occurrences: Some(2),
            error: None,
        },
        r#"{"occurrences":2,"error":null}"#,
    );
    sent_as(
        &FsDeleteResponse {
            ok: true,
            removed: false,
            error: None,
        },
        r#"{"ok":true,"removed":false,"error":null}"#,
    );
}

/// The envelope, byte for byte: the ready event as the helper's first frame, and a request.
#[test]
fn frames_have_their_bytes() {
    let mut out = Vec::new();
    frame::encode_json(
        0,
        kind::EVENT,
        &Event::Ready {
            protocol: sandbox_protocol::VERSION,
            version: "0.1.0".into(),
            pid: 7,
        },
        &mut out,
    );
    let payload = br#"{"type":"ready","protocol":8,"version":"0.1.0","pid":7}"#;
    let mut expected = vec![0, 0, 0, payload.len() as u8 + 5, 0, 0, 0, 0, 5];
    expected.extend_from_slice(payload);
    assert_eq!(out, expected);

    let mut out = Vec::new();
    frame::encode_json(258, kind::REQUEST, &Request::Ping, &mut out);
    assert_eq!(out, b"\0\0\0\x12\0\0\x01\x02\x01{\"op\":\"ping\"}".to_vec());
    assert_eq!(
        [
            kind::REQUEST,
            kind::DATA,
            kind::EOF,
            kind::CANCEL,
            kind::EVENT,
            kind::RESPONSE,
            kind::STDERR,
            kind::WINDOW
        ],
        [1, 2, 3, 4, 5, 6, 7, 8]
    );
    assert_eq!(frame::window_payload(65_536), [0, 1, 0, 0]);
    assert_eq!(frame::window_bytes(&[0, 1, 0, 0]), Some(65_536));
    assert_eq!(frame::window_bytes(&[0, 1, 0]), None);
    assert_eq!(sandbox_protocol::VERSION, 8);
}
