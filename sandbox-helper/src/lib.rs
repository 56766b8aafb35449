//! daiv-sandbox's in-container helper: a small static binary that runs inside each session
//! container as the sandbox user and serves commands, workspace file operations and seed
//! extraction to the control plane over the stdin/stdout of one long-lived `docker exec -i`.
//! Running as the sandbox user makes permissions the kernel's; resolving every path itself
//! (see [`ops::resolve`]) keeps every file operation inside `/workspace` whatever symlinks a
//! command plants. It needs no shell (only `run` does) and no libc at run time.
//!
//! # Layout
//! - [`layout`]: the paths inside a sandbox (`/workspace/...`, the service directory, the
//!   egress CA) and the processes socket, shared with the control plane. Built without the
//!   `server` feature.
//! - [`wire`]: the `fs/*` request/response types the HTTP API and the helper share, their
//!   constants and [`wire::validate_path`]. Built without the `server` feature.
//! - [`protocol`]: frames ([`protocol::encode`], [`protocol::FrameDecoder`],
//!   [`protocol::read_frame`]) and messages ([`protocol::Request`], [`protocol::Event`],
//!   [`protocol::Response`]). Built without the `server` feature.
//! - `ops` (feature `server`): `resolve` (confined path resolution), `fs` (ls, read, grep,
//!   glob, write, edit, delete), `text` (paging and replacement), `ere` (POSIX ERE to the
//!   `regex` crate), `run` (commands), `extract` (seed tar, clear), `serve` (the frame loop).
//! - `src/main.rs`: the `daiv-sandbox-helper` binary: `serve [--root DIR]`, `init`, `--version`.
//!
//! Features: `server` (default) is everything the binary needs; `openapi` adds `utoipa`
//! schemas to [`wire`]. The control plane depends on this crate with `default-features =
//! false, features = ["openapi"]`.
//!
//! # Protocol (version 1)
//!
//! ## Frames
//! Every message either way is one frame:
//!
//! ```text
//! len: u32 big-endian | id: u32 big-endian | kind: u8 | payload: len - 5 bytes
//! ```
//!
//! `len = 5 + payload.len()` and `payload.len() <= MAX_PAYLOAD` (16 MiB: the largest answer, a listing or a page of matches, as the shell-script implementation allowed). A frame with `len < 5`
//! or a larger payload is a protocol error: the helper writes a diagnostic to stderr and exits
//! with status 2 (so does a stream that ends inside a frame). The helper never sends a frame
//! over the limit either (see RESPONSE).
//!
//! | kind | name | direction | payload |
//! | --- | --- | --- | --- |
//! | 1 | REQUEST | client→helper | JSON [`protocol::Request`]; starts request `id` |
//! | 2 | DATA | both | raw bytes: client→helper the request's input (write content, seed tar); helper→client the output of the command running in that `run` (≤ 64 KiB per frame) |
//! | 3 | EOF | client→helper | empty: end of the request's input |
//! | 4 | CANCEL | client→helper | empty: abandon request `id` |
//! | 5 | EVENT | helper→client | JSON [`protocol::Event`]: progress |
//! | 6 | RESPONSE | helper→client | JSON [`protocol::Response`]: the final answer |
//!
//! Ids are picked by the client: nonzero, unique among live requests (a request is live from
//! its REQUEST until its RESPONSE). Id 0 carries only the `ready` event. Frames of one id are in
//! order; frames of different ids interleave (each request runs on its own thread; one writer
//! serialises frames to stdout and flushes whenever its queue is empty). No frame for an id
//! follows its RESPONSE.
//!
//! ## Lifecycle
//! - On start the helper sends EVENT id 0
//!   `{"type":"ready","protocol":1,"version":"<crate version>","pid":N}`.
//! - EOF on stdin (the client went away): every request is cancelled, running process groups
//!   are killed, the helper exits 0.
//! - stderr carries the helper's own diagnostics only.
//!
//! ## Errors outside a request
//! - REQUEST with bad JSON or an unknown `op`, id 0, or an id already live: RESPONSE
//!   `bad_request` for that id.
//! - A frame of unknown kind (including EVENT/RESPONSE sent to the helper): RESPONSE
//!   `bad_request` for that id; if the id is live, the request is stopped and that is its answer.
//! - DATA, EOF or CANCEL for an id that is not live: ignored (input after an answer).
//!
//! ## Requests
//! `Request` is JSON with an `op` tag. Paths are wire paths under `/workspace`; the helper
//! validates them again with [`wire::validate_path`] and trusts nothing.
//!
//! - `{"op":"ping"}` → ok `{}`.
//! - `{"op":"seeded"}` → ok `{"seeded":bool}`: whether the root-owned seed marker exists (the one
//!   path outside `/workspace` the helper looks at; the sandbox user can neither create nor
//!   remove it).
//! - `{"op":"run","commands":[str],"fail_fast":bool,"timeout_ms":u64|null,"output_cap":u64,
//!   "workdir":str,"env":[[str,str]]}` (defaults: `fail_fast` false, `timeout_ms` null = none,
//!   0 also none, `output_cap` 16 MiB, `workdir` `/workspace/repo`, `env` empty). Events per
//!   command, then RESPONSE ok `{}`; details below.
//! - `{"op":"ls","path"}` → ok [`wire::FsLsResponse`].
//! - `{"op":"read","path","offset"?,"limit"?}` (defaults 0, 2000) → ok [`wire::FsReadResponse`].
//! - `{"op":"grep","pattern","path","glob":str|null,"prune":[str]}` → ok
//!   [`wire::FsGrepResponse`].
//! - `{"op":"glob","pattern","path","prune":[str]}` → ok [`wire::FsGlobResponse`].
//! - `{"op":"write","path","mode"?}` (default 0o644) + DATA* + EOF → ok
//!   [`wire::FsWriteResponse`]. `mode` over 0o7777 → `bad_request`.
//! - `{"op":"edit","path","old","new","replace_all"?}` → ok [`wire::FsEditResponse`].
//! - `{"op":"delete","path"}` → ok [`wire::FsDeleteResponse`].
//! - `{"op":"extract","dest"}` + DATA* (a tar stream) + EOF → ok
//!   `{"files":n,"dirs":n,"symlinks":n,"bytes":n,"skipped":n}` ([`protocol::ExtractStats`]).
//! - `{"op":"clear","dest"}` → removes everything inside `dest` (not `dest` itself; an absent
//!   `dest` is already clear) → ok `{}`.
//!
//! `prune` is the full list of directory basename globs to prune at any depth (the server's list
//! plus the request's `exclude`, merged by the client). Every fs request (`ls` … `delete`) may
//! carry `"deadline_ms": u64` (default 30000): past it the op stops and answers `deadline`.
//! `extract` and `clear` take an optional `deadline_ms` and have none by default.
//!
//! Requests with input (`write`, `extract`) are answered only after their EOF (or a CANCEL):
//! input after an early failure is read and dropped, so no DATA frame outlives the answer.
//!
//! ## Responses
//! `{"ok": value}` or `{"error": {"kind": "bad_request"|"cancelled"|"deadline"|"io"|"internal",
//! "message": str}}`. For fs ops `ok` is the complete wire response including its `error`
//! field: fs-level problems (`not_found`, `permission_denied`, …) are `ok` with `error` set,
//! exactly as the HTTP API answers them. A CANCEL makes the answer `cancelled` unless the
//! request had already been answered. A response that would exceed `MAX_PAYLOAD` is replaced by
//! an `io` error saying so (a listing or glob of a huge tree: narrow the request).
//!
//! ## Events
//! `{"type":"ready","protocol":1,"version":str,"pid":n}` (id 0) ·
//! `{"type":"started","index":i}`: command `i` of a `run` began; the DATA frames that follow are
//! its output · `{"type":"finished","index":i,"exit_code":n,"omitted":n,"timed_out":bool}`.
//!
//! ## Commands
//! The shell is picked once per helper process: `bash` on PATH → `bash -o pipefail -c CMD`;
//! else if `sh -o pipefail -c true` succeeds → `sh -o pipefail -c CMD`; else `sh -c CMD`; with no
//! shell at all each command finishes with exit code 127 and the output
//! `daiv-sandbox: no shell in this image\n`. Each command: stdin `/dev/null`; stdout and stderr
//! into one pipe (interleaved as produced); its own process group; cwd `workdir` (a
//! `/workspace/...` workdir maps under the served root); the helper's environment plus `env`.
//! Output past `output_cap` bytes is counted in `omitted`, not sent. A timeout (per command, from
//! its start) SIGKILLs the whole process group: exit code 124, `timed_out` true, output so far
//! kept, remaining commands skipped. `fail_fast` stops after the first nonzero exit. Once the
//! shell has exited, what is already in the pipe is taken and the command is done, even if a
//! background child still holds the pipe open. CANCEL kills the running group. One `run` runs
//! at a time per helper: a cancelled batch's group is dead before the next batch starts. Exit code: the
//! code, or 128 + signal. A shell that cannot be started (e.g. `workdir` missing) ends the run
//! with an `io` error.
//!
//! ## Path safety
//! Every path is resolved component by component from an fd of the root with `O_PATH |
//! O_NOFOLLOW`, symlinks read with `readlinkat` and resolved by the helper: absolute targets
//! must lie under `/workspace/` (resolution continues from the root fd), anything else is
//! `permission_denied` with a message saying the link leads outside `/workspace`; `..` never
//! climbs above the root; more than 40 links is `exec_failed` ("too many levels of symbolic
//! links"). Final opens use `O_NOFOLLOW` and `O_NONBLOCK`, then `fstat`: only regular files
//! are read. Writes create with `O_CREAT | O_EXCL | O_NOFOLLOW` from the parent's fd.

pub mod layout;
pub mod protocol;
pub mod wire;

#[cfg(feature = "server")]
pub mod identity;
#[cfg(feature = "server")]
pub mod ops;
