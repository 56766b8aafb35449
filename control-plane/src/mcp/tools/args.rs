//! Each tool's arguments (their JSON schema, written for a model) and the tool list.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

/// The session every tool but `session_create` works on.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionArgs {
    /// The id session_create (or fork) returned.
    pub session_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    /// Docker image of the sandbox (e.g. "python:3.12"); required unless snapshot_id is given.
    #[serde(default)]
    pub image: Option<String>,
    /// Start from this snapshot's filesystem instead of a fresh image (from the snapshot tool).
    #[serde(default)]
    pub snapshot_id: Option<String>,
    /// Environment variables set in the sandbox for every command. Never put credentials here:
    /// give them to egress as secrets, which the sandbox never sees.
    #[serde(default)]
    pub environment: Option<BTreeMap<String, String>>,
    /// Memory limit in bytes (at least 6 MiB); the server default when omitted.
    #[serde(default)]
    pub memory_bytes: Option<i64>,
    /// CPU limit (e.g. 1.5); the server default when omitted.
    #[serde(default)]
    pub cpus: Option<f64>,
    /// Network access. Omit it for a sandbox with no network at all. Otherwise
    /// {"policy": {"default": "deny", "rules": [{"host": "api.github.com", "methods": ["GET"],
    /// "inject": "gh"}]}, "secrets": {"gh": {"header": "Authorization", "value": "Bearer ..."}}}:
    /// only hosts with a rule are reachable (host globs such as "*.pypi.org", optional methods
    /// and paths), and a rule's `inject` names a secret whose header is added to its requests
    /// outside the sandbox, so the sandbox never holds the credential.
    #[serde(default)]
    #[schemars(with = "Option<JsonObject>")]
    pub egress: Option<Value>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CloseArgs {
    /// The session to close.
    pub session_id: String,
    /// true (default): remove the sandbox and its files. false: only stop it; any later call
    /// on it restarts it with its files.
    #[serde(default = "yes")]
    pub remove: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    /// The session to run in.
    pub session_id: String,
    /// Bash commands, run one after the other in /workspace/repo (each in its own shell; cd
    /// does not carry over: chain with &&).
    pub commands: Vec<String>,
    /// Stop at the first command that exits non-zero (the rest are skipped).
    #[serde(default)]
    pub fail_fast: bool,
    /// Seconds each command may run (0: no limit); the server default when omitted. A command
    /// past it is killed with everything it started and exits 124.
    #[serde(default)]
    pub timeout: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    pub session_id: String,
    /// Absolute path of a file under /workspace (the repository is /workspace/repo).
    pub path: String,
    /// First line to read, 0-indexed (to continue a page: the previous answer's end_line).
    #[serde(default)]
    pub offset: u64,
    /// Most lines to read (default 2000).
    #[serde(default = "default_lines")]
    pub limit: u64,
}

fn default_lines() -> u64 {
    2000
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    pub session_id: String,
    /// Absolute path of a new file under /workspace; missing directories are created. An
    /// existing file is never overwritten (already_exists): change it with edit.
    pub path: String,
    /// The whole content of the file.
    pub content: String,
    /// "utf-8" (default): content is the text. "base64": content is base64 of the bytes.
    #[serde(default)]
    pub encoding: Option<String>,
    /// POSIX mode bits, e.g. 420 (0o644, the default) or 493 (0o755) for a script.
    #[serde(default)]
    pub mode: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditArgs {
    pub session_id: String,
    /// Absolute path of a text file under /workspace.
    pub path: String,
    /// The exact text to replace (whitespace included); it must occur exactly once unless
    /// replace_all.
    pub old: String,
    /// The text to put instead.
    pub new: String,
    /// Replace every occurrence.
    #[serde(default)]
    pub replace_all: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepArgs {
    pub session_id: String,
    /// POSIX extended regular expression searched in every line.
    pub pattern: String,
    /// Directory (or file) to search under /workspace; default /workspace/repo.
    #[serde(default)]
    pub path: Option<String>,
    /// Only files whose name matches this glob (e.g. "*.py").
    #[serde(default)]
    pub glob: Option<String>,
    /// Directory names to skip on top of the server's list (.git, node_modules, ...).
    #[serde(default)]
    pub exclude: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobArgs {
    pub session_id: String,
    /// `*` and `?` within a path segment, `**` across segments, `[abc]`: e.g. "**/*.rs".
    pub pattern: String,
    /// Directory to match under; default /workspace/repo.
    #[serde(default)]
    pub path: Option<String>,
    /// Directory names to skip on top of the server's list.
    #[serde(default)]
    pub exclude: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LsArgs {
    pub session_id: String,
    /// Directory under /workspace; default /workspace/repo.
    #[serde(default)]
    pub path: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessStartArgs {
    pub session_id: String,
    /// Shell command run in the background (a server, a watcher, a long build); it outlives
    /// this call and dies with the session.
    pub command: String,
    /// Variables added to the session's environment for this process.
    #[serde(default)]
    pub environment: Option<BTreeMap<String, String>>,
    /// Working directory (an absolute path the sandbox user may enter); default /workspace/repo.
    #[serde(default)]
    pub workdir: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessOutputArgs {
    pub session_id: String,
    /// The id process_start returned.
    pub process_id: String,
    /// Byte offset to read from: 0 first, then the previous answer's next_offset.
    #[serde(default)]
    pub offset: u64,
    /// Seconds to wait for new output when there is none yet (capped by the server).
    #[serde(default)]
    pub wait: f64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessKillArgs {
    pub session_id: String,
    /// The id process_start returned.
    pub process_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PortUrlArgs {
    pub session_id: String,
    /// The port a server in the sandbox listens on (1024 to 65535).
    pub port: u16,
    /// How long the token works, in seconds (default: the deployment's longest).
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeArgs {
    /// A session whose image runs the code interpreter (e.g. daiv-sandbox-code-interpreter:local).
    pub session_id: String,
    /// The code: a cell, run in a kernel that keeps its variables, imports and definitions
    /// from one call to the next.
    pub code: String,
    /// "python" (default) or "bash": the session's default context of that language.
    #[serde(default)]
    pub language: Option<String>,
    /// A context made with the REST API (its own kernel and working directory) instead.
    #[serde(default)]
    pub context_id: Option<String>,
    /// Environment variables for this execution only.
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// Seconds the code may run; past it the kernel is interrupted (its state is kept).
    #[serde(default)]
    pub timeout: Option<f64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressArgs {
    /// A session created with egress.
    pub session_id: String,
    /// The new policy and secrets, as session_create's egress; replaces the old one at once.
    #[schemars(with = "JsonObject")]
    pub egress: Value,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotArgs {
    pub session_id: String,
    /// A name of your choosing (1 to 128 characters).
    #[serde(default)]
    pub name: Option<String>,
    /// Seconds the snapshot is kept; the server default when omitted.
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkArgs {
    pub session_id: String,
    /// How many copies (default 1).
    #[serde(default = "one")]
    pub count: u32,
    /// The copies' environment; the source's when omitted.
    #[serde(default)]
    pub environment: Option<BTreeMap<String, String>>,
}

fn one() -> u32 {
    1
}

// === the tool list ===

/// Every tool, in the order `tools/list` gives them.
pub fn list() -> &'static [Tool] {
    static TOOLS: OnceLock<Vec<Tool>> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let ro = |t: Tool| t.annotate(ToolAnnotations::new().read_only(true));
        vec![
            tool::<CreateArgs>(
                "session_create",
                "Create a sandbox: a Linux container with bash, its repository directory \
                 /workspace/repo, and no network unless egress allows hosts. Returns its \
                 session_id, which every other tool takes. Give credentials only as egress \
                 secrets: they are added to matching requests outside the sandbox and never \
                 appear in it.",
            ),
            tool::<CloseArgs>(
                "session_close",
                "Close a session when done with it: removes the sandbox and its files (or, \
                 with remove=false, only stops it).",
            ),
            tool::<RunArgs>(
                "run",
                "Run bash commands in the sandbox, in order, in /workspace/repo, and return \
                 each one's exit code and output (stdout and stderr interleaved). Output past \
                 the per-call bound keeps its start and end with a marker in between: redirect \
                 long output to a file and read or grep it. Progress notifications carry the \
                 output as it is printed; cancelling the call kills the command.",
            ),
            ro(tool::<ReadArgs>(
                "read",
                "Read a file of the sandbox by lines (a page of at most limit lines and \
                 512000 bytes; continue with offset=end_line). Binary files come base64-encoded.",
            )),
            tool::<WriteArgs>(
                "write",
                "Create a new file in the sandbox with the given content (missing directories \
                 are created). Refuses to overwrite an existing file: use edit for that.",
            ),
            tool::<EditArgs>(
                "edit",
                "Replace an exact piece of text in a file of the sandbox (once, or everywhere \
                 with replace_all). Returns how many replacements were made.",
            ),
            ro(tool::<GrepArgs>(
                "grep",
                "Search file contents with a POSIX extended regex; returns path, line number \
                 and text of each match (at most 200: narrow the search past that).",
            )),
            ro(tool::<GlobArgs>(
                "glob",
                "Find files by path pattern (e.g. **/*.py) under a directory of the sandbox.",
            )),
            ro(tool::<LsArgs>(
                "ls",
                "List one directory of the sandbox: directories first, then files.",
            )),
            tool::<ProcessStartArgs>(
                "process_start",
                "Start a background process (a dev server, a watcher) that keeps running \
                 after this call; read its output with process_output and stop it with \
                 process_kill.",
            ),
            ro(tool::<ProcessOutputArgs>(
                "process_output",
                "A background process's state (running, exit_code) and its output from \
                 offset; pass next_offset as the next call's offset. Set wait to block a few \
                 seconds for new output.",
            )),
            tool::<ProcessKillArgs>(
                "process_kill",
                "Kill a background process and everything it started.",
            ),
            tool::<PortUrlArgs>(
                "port_url",
                "A URL and token that reach a server listening on a port inside the sandbox \
                 (a web app, an API you started with process_start), to show a person or to \
                 call: send the token in X-Daiv-Port-Token, or open url_with_token in a \
                 browser.",
            ),
            tool::<EgressArgs>(
                "egress_update",
                "Replace the network policy and secrets of a session created with egress, \
                 without restarting anything.",
            ),
            tool::<SnapshotArgs>(
                "snapshot",
                "Save the session's whole filesystem as a snapshot; session_create with \
                 snapshot_id starts new sessions from it. Running processes and egress secrets \
                 are not kept.",
            ),
            tool::<ForkArgs>(
                "fork",
                "Copy a running session into count new sessions (files as they are now, the \
                 same egress policy), e.g. to try alternatives side by side. Returns their \
                 session_ids.",
            ),
            tool::<SessionArgs>(
                "pause",
                "Freeze a session, keeping its memory and processes, to save resources while \
                 it is not needed; the next call on it resumes it.",
            ),
            tool::<RunCodeArgs>(
                "run_code",
                "Run a cell of Python (or bash) in the session's code interpreter, a Jupyter \
                 kernel that keeps its state between calls (define a DataFrame in one call, \
                 plot it in the next). Returns stdout, stderr, the cell's results as text and \
                 charts as images, and an exception with its traceback. The session's image \
                 must run the interpreter (daiv-sandbox-code-interpreter:local).",
            ),
        ]
    })
}

fn tool<T: JsonSchema + 'static>(name: &'static str, description: &'static str) -> Tool {
    let schema = rmcp::handler::server::common::schema_for_input::<T>()
        .unwrap_or_else(|e| panic!("{name}: its arguments' schema is not an object: {e}"));
    Tool::new(name, description, schema)
}
