//! The contract between daiv-sandbox's control plane and `daiv-sandbox-helper`, the helper
//! inside each session container: one typed definition both sides build and read, so they
//! cannot drift apart. Serde types and pure functions only (no I/O runtime, no logging).
//!
//! - [`frame`]: the envelope of every message ([`frame::encode`], the incremental
//!   [`frame::FrameDecoder`], the blocking [`frame::read_frame`]) and the frame kinds.
//! - [`message`]: what frames carry: [`message::Request`] (and [`message::ProcRequest`]),
//!   [`message::Event`], [`message::Response`] with its [`message::ErrorKind`], and the `ok`
//!   values that are not fs wire types.
//! - [`write_file`]: the input of the helper's `write-file` command ([`write_file::WriteHeader`]).
//! - [`wire`]: the `fs/*` request and response types the HTTP API serves and the helper answers
//!   with, their limits and [`wire::validate_path`].
//! - [`files`]: the data plane's wire types (`stat`, `mkdir`, `move`, `list`, raw file
//!   answers) and [`files::validate_any_path`].
//! - [`layout`]: the paths inside a sandbox.
//! - [`text`]: where output may be cut without splitting a character.
//!
//! Feature `openapi` adds `utoipa` schemas to [`wire`]. `tests/snapshot.rs` pins the JSON of
//! every message: a change to the protocol is never silent.
//!
//! # Protocol (version 7)
//!
//! The control plane (the client) opens one long-lived `docker exec -i` of
//! `daiv-sandbox-helper serve` per session and replica, and speaks this on its stdin/stdout.
//!
//! ## Frames
//! Every message either way is one frame:
//!
//! ```text
//! len: u32 big-endian | id: u32 big-endian | kind: u8 | payload: len - 5 bytes
//! ```
//!
//! `len = 5 + payload.len()` and `payload.len() <= MAX_PAYLOAD` (16 MiB: the largest answer, a
//! data-plane listing or a page of matches, as the shell-script implementation allowed). A frame with
//! `len < 5` or a larger payload is a protocol error: the helper writes a diagnostic to stderr
//! and exits with status 2 (so does a stream that ends inside a frame). The helper never sends a
//! frame over the limit either (see RESPONSE).
//!
//! | kind | name | direction | payload |
//! | --- | --- | --- | --- |
//! | 1 | REQUEST | client→helper | JSON [`message::Request`]; starts request `id` |
//! | 2 | DATA | both | raw bytes: client→helper the request's input (write content, seed tar, a process's stdin); helper→client the output of the command running in that `run` (≤ 64 KiB per frame), a poll's output, a `file_read`'s bytes or a chunk of an `ls` or `glob` listing |
//! | 3 | EOF | both | empty: end of the request's input; helper→client only for a `connect`, whose connection's read side ended |
//! | 4 | CANCEL | client→helper | empty: abandon request `id` |
//! | 5 | EVENT | helper→client | JSON [`message::Event`]: progress |
//! | 6 | RESPONSE | helper→client | JSON [`message::Response`]: the final answer |
//! | 7 | STDERR | helper→client | raw bytes: the stderr of the command running in a `run` with `"split":true` (its stdout is then DATA) |
//! | 8 | WINDOW | both | a `connect`'s flow control: 4 bytes big-endian, the DATA bytes the receiver may now send more (protocol 7) |
//!
//! Ids are picked by the client: nonzero, unique among live requests (a request is live from
//! its REQUEST until its RESPONSE). Id 0 carries only the `ready` event. Frames of one id are in
//! order; frames of different ids interleave. No frame for an id follows its RESPONSE.
//!
//! ## Lifecycle
//! - On start the helper sends EVENT id 0
//!   `{"type":"ready","protocol":8,"version":"<crate version>","pid":N}`. The client speaks
//!   only to a helper whose `protocol` is its own [`VERSION`].
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
//! - `{"op":"seeded"}` → ok `{"seeded":bool}` ([`message::SeededInfo`]): whether the root-owned
//!   seed marker exists (the one path outside `/workspace` the helper looks at; the sandbox user
//!   can neither create nor remove it).
//! - `{"op":"disk"}` → ok `{"total_bytes":u64,"used_bytes":u64}` ([`message::DiskInfo`]): the
//!   workspace filesystem's size and the bytes allocated under `/workspace`.
//! - `{"op":"run","commands":[str],"fail_fast":bool,"timeout_ms":u64|null,"output_cap":u64,
//!   "workdir":str,"env":[[str,str]]}` (defaults: `fail_fast` false, `timeout_ms` null = none,
//!   0 also none, `output_cap` 16 MiB, `workdir` `/workspace/repo`, `env` empty). For each
//!   command a `started` event, its output as DATA frames, a `finished` event; then RESPONSE ok
//!   `{}`. How commands run is the helper's to document.
//! - `{"op":"ls","path","max_bytes"?}` (default [`wire::LIST_MAX_BYTES`]) → EVENT
//!   `{"type":"listing","entries":n,"bytes":n}`, then the entries as DATA frames, each a JSON
//!   array of whole [`wire::FsEntry`] values of at most [`wire::LISTING_CHUNK`] bytes (one
//!   larger entry alone, up to [`wire::LISTING_FRAME_MAX`]), in the listing's order, then ok
//!   `{}` (protocol 6). The helper finds every entry before it sends the first: a problem
//!   (`not_found`, a listing over `max_bytes`: `too_large`, ...) is ok [`wire::FsLsResponse`]
//!   with its `error` and no event, so the answer is all of the listing or an error.
//! - `{"op":"read","path","offset"?,"limit"?}` (defaults 0, 2000) → ok [`wire::FsReadResponse`].
//! - `{"op":"grep","pattern","path","glob":str|null,"prune":[str]}` → ok
//!   [`wire::FsGrepResponse`].
//! - `{"op":"glob","pattern","path","prune":[str],"max_bytes"?}` → as `ls` (its error answer
//!   an [`wire::FsGlobResponse`]).
//! - `{"op":"write","path","mode"?}` (default 0o644) + DATA* + EOF → ok
//!   [`wire::FsWriteResponse`]. `mode` over 0o7777 → `bad_request`.
//! - `{"op":"edit","path","old","new","replace_all"?}` → ok [`wire::FsEditResponse`].
//! - `{"op":"delete","path"}` → ok [`wire::FsDeleteResponse`].
//! - `{"op":"extract","dest"}` + DATA* (a tar stream) + EOF → ok
//!   `{"files":n,"dirs":n,"symlinks":n,"bytes":n,"skipped":n}` ([`message::ExtractStats`]).
//! - `{"op":"clear","dest"}` → removes everything inside `dest` (not `dest` itself; an absent
//!   `dest` is already clear) → ok `{}`.
//! - `{"op":"proc","request":{"action":...}}` ([`message::ProcRequest`]): a background-process
//!   request, relayed to the container's process supervisor: `start` → ok `{"process_id"}`
//!   ([`message::ProcStarted`]); `list` → ok `{"processes":[...]}` ([`message::ProcList`]);
//!   `poll` → one DATA frame of output, then ok [`message::PollInfo`]; `stdin` + DATA* + EOF →
//!   ok `{}`; `kill` → ok `{}`; `events` → one DATA frame (the output events' bytes), then ok
//!   [`message::ProcEvents`]; `signal` → ok `{}`. Its refusals are `not_found`, `conflict`,
//!   `limit`, `gone` and `io`.
//!
//! - Protocol 2, the data plane (paths anywhere in the container, [`files::validate_any_path`];
//!   the service directory refused; fs-level problems in the answer's `error` as above):
//!   `{"op":"stat","path"}` → ok [`files::FsStatResponse`]; `{"op":"mkdir","path","parents"?}`
//!   → ok [`files::FsMkdirResponse`]; `{"op":"move","source","destination"}` → ok
//!   [`files::FsMoveResponse`]; `{"op":"list","path","depth"?}` → ok [`files::FsListResponse`];
//!   `{"op":"file_read","path","range"?:{"first"?,"last"?}}` → EVENT
//!   `{"type":"file","size","start","length"}`, `length` bytes as DATA frames (≤ 64 KiB each),
//!   ok [`files::FileAnswer`] (a missing file, a directory, a range past the end: no event, the
//!   answer's `error`); `{"op":"file_write","path","mode"?,"parents"?,"max_bytes"}` + DATA* +
//!   EOF → ok [`files::FileAnswer`] (written beside, renamed over: never half a file).
//! - Protocol 4: `{"op":"watch","path","recursive"?}` → EVENT `{"type":"armed","watches":n}`,
//!   then `{"type":"change","change":"create"|"write"|"remove"|"rename"|"chmod","path","entry"?}`
//!   per change and `{"type":"overflow"}` where changes were lost, until CANCEL or the directory
//!   goes; ok [`files::FileAnswer`] (a path that cannot be watched: no event, its `error`).
//! - Protocol 7: `{"op":"connect","port":u16,"window":u32}`: a TCP connection to
//!   `127.0.0.1:port` in the sandbox's network namespace (ingress). Connected: EVENT
//!   `{"type":"connected","window":n}`, then DATA both ways, each side sending no more than the
//!   other granted (`window` of the request and of the event, then WINDOW frames as the bytes
//!   are delivered), so neither side ever buffers more than it granted and a slow reader never
//!   stalls the channel. A connection's DATA frames carry at most 256 KiB
//!   (`frame::RELAY_CHUNK`) either way. EOF either way is a half close. Ok `{}` once both directions ended
//!   (or after CANCEL: `cancelled`); nothing listening: `refused`, no event.
//!
//! `prune` is the full list of directory basename globs to prune at any depth (the server's list
//! plus the request's `exclude`, merged by the client). Every fs request (`ls` … `delete`) may
//! carry `"deadline_ms": u64` (default 30000): past it the op stops and answers `deadline`.
//! `extract` and `clear` take an optional `deadline_ms` and have none by default.
//!
//! Requests with input (`write`, `extract`, a process's `stdin`) are answered only after their
//! EOF (or a CANCEL): input after an early failure is read and dropped, so no DATA frame outlives
//! the answer.
//!
//! ## Responses
//! `{"ok": value}` or `{"error": {"kind": "bad_request"|"cancelled"|"deadline"|"io"|"internal"|
//! "not_found"|"conflict"|"limit"|"gone"|"refused", "message": str}}`. For fs ops `ok` is the complete wire
//! response including its `error` field: fs-level problems (`not_found`, `permission_denied`,
//! …) are `ok` with `error` set, exactly as the HTTP API answers them. A CANCEL makes the answer
//! `cancelled` unless the request had already been answered. A response that would exceed
//! `MAX_PAYLOAD` is replaced by an `io` error saying so (a `grep` page or a data-plane `list`
//! of huge lines or paths).
//!
//! ## Events
//! `{"type":"ready","protocol":6,"version":str,"pid":n}` (id 0) ·
//! `{"type":"started","index":i}`: command `i` of a `run` began; the DATA frames that follow are
//! its output · `{"type":"finished","index":i,"exit_code":n,"omitted":n,"timed_out":bool,"duration_ms"?:n,
//! "cpu_ms"?:n,"max_rss_bytes"?:n}` ([`message::Usage`]; a process's list entry and poll answer
//! carry the same three once it ended).
//!
//! ## Versions
//! 1: the first. 2: `finished` events, list entries and poll answers carry
//! [`message::Usage`]; the data plane's requests (`stat`, `mkdir`, `move`, `list`,
//! `file_read`, `file_write`) and the `file` event. 3: `disk`. 4: a `run`'s `split` and the
//! STDERR frame; processes' client ids, tags, pids, `events` and `signal`; the `gone` error; `watch` and its
//! `armed`, `change` and `overflow` events; processes in a terminal (`pty` on `start`, `resize`).
//! 5: `file_write`'s `in_place`. 6: `ls` and `glob` stream every entry (the `listing` event,
//! DATA chunks) up to their `max_bytes`, instead of one answer capped at 1,000 entries.
//! 7: `connect`, the WINDOW frame, EOF from the helper, the `connected` event and `refused`.
//! 8: `file_write`'s `metadata`, and entries' `metadata` (`user.e2b.*` extended attributes).

pub mod files;
pub mod frame;
pub mod layout;
pub mod message;
pub mod text;
pub mod wire;
pub mod write_file;

/// Protocol version the helper announces in its `ready` event; bumped on any change a peer of
/// the other version would misread.
pub const VERSION: u32 = 8;
