//! daiv-sandbox's in-container helper: a small static binary that runs inside each session
//! container and serves commands, workspace file operations, seed extraction and background
//! processes to the control plane over the stdin/stdout of one long-lived `docker exec -i`,
//! speaking the protocol of the `sandbox_protocol` crate (frames, messages, `write-file`'s
//! input, the fs wire types and the paths inside a sandbox are all defined there). It acts on
//! the workspace as the sandbox user, so permissions are the kernel's, and resolves every path
//! itself (see [`ops::resolve`]), which keeps every file operation inside `/workspace` whatever
//! symlinks a command plants. It needs no shell (only `run` does) and no libc at run time.
//!
//! # Layout
//! - [`server`]: `serve`: the frame loop on stdin/stdout, configured by a
//!   [`server::Config`] (root, service directory, processes socket, identity); `handle` turns
//!   each request into an op and its outcome into the response, `out` owns stdout.
//! - [`ops`]: what requests do, knowing nothing of frames: `resolve` (confined path
//!   resolution), `fs` (ls, read, grep, glob, write, edit, delete; split into `walk`, `grep`
//!   and `errno`), `text` (paging and replacement), `ere` (POSIX ERE to the `regex` crate),
//!   `run` (commands), `extract` (seed tar, clear).
//! - [`procs`]: background processes: the [`procs::supervisor`] (`init`'s side, which owns
//!   them) and its [`procs::client`] (`serve`'s side, which relays requests to it).
//! - [`identity`]: the helper's own uid, and acting for the sandbox user.
//! - [`env_file`]: the caller's environment, read by runs and process starts.
//! - [`write_file`]: the `write-file` command.
//! - [`copy_tree`]: the `copy-tree` command (a sandbox's frozen overlay upper directory copied
//!   faithfully into a new layer, never following its symlinks).
//! - [`writable`]: the `writable-paths` command (what in an image a sandbox user could change,
//!   outside the volumes: none lets a snapshot skip `docker commit`).
//! - [`usage`]: what a command or background process cost (time, CPU of its tree, peak memory).
//! - `src/main.rs`: the `daiv-sandbox-helper` binary: `serve`, `init`, `write-file`,
//!   `copy-tree`, `writable-paths`, `--version`; it parses flags into the configurations above.
//!
//! # Commands
//! The shell is picked once per helper process: `bash` on PATH → `bash -o pipefail -c CMD`;
//! else if `sh -o pipefail -c true` succeeds → `sh -o pipefail -c CMD`; else `sh -c CMD`; with no
//! shell at all each command finishes with exit code 127 and the output
//! `daiv-sandbox: no shell in this image\n`. Each command: stdin `/dev/null`; stdout and stderr
//! into one pipe (interleaved as produced); its own process group; cwd `workdir` (a
//! `/workspace/...` workdir maps under the served root); the helper's environment, plus the
//! caller's ([`env_file`]), plus `env`. Output past `output_cap` bytes is counted in `omitted`,
//! not sent. A timeout (per command, from its start) SIGKILLs the whole process group: exit
//! code 124, `timed_out` true, output so far kept, remaining commands skipped. `fail_fast` stops after the first nonzero exit. Once the
//! shell has exited, what is already in the pipe is taken and the command is done, even if a
//! background child still holds the pipe open. CANCEL kills the running group. One `run` runs
//! at a time per helper: a cancelled batch's group is dead before the next batch starts. Exit
//! code: the code, or 128 + signal. Each `finished` event carries the command's
//! [`usage`]: `duration_ms`, `cpu_ms` and `max_rss_bytes`. A shell that cannot be started (e.g. `workdir` missing)
//! ends the run with an `io` error.
//!
//! # Path safety
//! Every path is resolved component by component from an fd of the root with `O_PATH |
//! O_NOFOLLOW`, symlinks read with `readlinkat` and resolved by the helper: absolute targets
//! must lie under `/workspace/` (resolution continues from the root fd), anything else is
//! `permission_denied` with a message saying the link leads outside `/workspace`; `..` never
//! climbs above the root; more than 40 links is `exec_failed` ("too many levels of symbolic
//! links"). Final opens use `O_NOFOLLOW` and `O_NONBLOCK`, then `fstat`: only regular files
//! are read. Writes create with `O_CREAT | O_EXCL | O_NOFOLLOW` from the parent's fd.

pub mod copy_tree;
pub mod disk;
pub mod env_file;
pub mod identity;
pub mod ops;
pub mod procs;
pub mod server;
pub mod usage;
pub mod writable;
pub mod write_file;
