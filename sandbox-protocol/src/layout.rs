//! Where things live inside a sandbox container. The control plane builds the skeleton, seeds
//! the workspace, installs the helper, the caller's environment and the egress CA at these paths;
//! the helper confines, serves and reads them. Both sides take them from here, so they cannot
//! drift apart.
//!
//! Two trees: `/workspace`, the sandbox user's (a volume; every fs op is confined to it), and
//! `/.daiv-sandbox`, root's (the sandbox user can run the helper and read the files there, but
//! never replace them: the helper serves every fs op).

// === the workspace: the sandbox user's ===

/// The workspace volume: root of everything the fs ops may touch.
pub const WORKSPACE: &str = "/workspace";
/// Where the `repo_archive` seed lands; also the default working directory of commands and
/// background processes.
pub const REPO: &str = "/workspace/repo";
/// Where the `skills_archive` seed lands.
pub const SKILLS: &str = "/workspace/skills";
/// Scratch space inside the workspace.
pub const TMP: &str = "/workspace/tmp";

/// The sandbox user's home: writable, outside the workspace so seeds and `git status` stay clean.
pub const HOME: &str = "/home/sandbox";

/// E2B's templates' home for their user, `user`: the sandbox user's too (E2B's SDK assumes it).
pub const E2B_HOME: &str = "/home/user";

/// Everything a sandbox user can write, each on a volume of the session's own (its key names
/// that volume and the layer directory it is copied to): with nothing else writable in the
/// container's layer, a snapshot copies these and commits nothing. The homes are the sandbox
/// user's; the last three are made `root:root` `1777` in every sandbox, as Debian has them.
pub const STATE: [(&str, &str); 6] = [
    ("workspace", WORKSPACE),
    ("home", HOME),
    ("home-user", E2B_HOME),
    ("tmp", "/tmp"),
    ("var-tmp", "/var/tmp"),
    ("run-lock", "/run/lock"),
];
/// The [`STATE`] directories every sandbox has world-writable with the sticky bit.
pub const SHARED_TMP: [&str; 3] = ["/tmp", "/var/tmp", "/run/lock"];

// === the service directory: root's ===

/// The service's own directory.
pub const SERVICE_DIR: &str = "/.daiv-sandbox";
/// The helper binary (`init` keeps the container alive, `serve` runs the protocol).
pub const HELPER: &str = "/.daiv-sandbox/daiv-sandbox-helper";
/// Where the engine's one copy of the helper is mounted read-only, shared by every sandbox on it;
/// [`HELPER`] is then a link into it. A sandbox made before that has its own copy at [`HELPER`].
pub const HELPER_DIR: &str = "/.daiv-sandbox/bin";
/// The session's own state: an anonymous volume of its container, so nothing here is in the
/// container's layer, and `docker commit` (a snapshot, a fork) never keeps it. Inside the service
/// directory: the sandbox user can read it, never change it, and no fs op reaches it.
pub const SESSION_DIR: &str = "/.daiv-sandbox/session";
/// The caller's environment (a JSON list of `[name, value]` pairs): commands and processes get it
/// on top of the container's environment, which holds only the service's own variables (home,
/// egress proxy settings). Written by the skeleton at a create, by a warm-pool claim's exec for
/// a claimed member; `[]` when the caller gave none.
pub const ENV_FILE: &str = "/.daiv-sandbox/session/environment";
/// Present once the workspace has been seeded: a second seed is refused.
pub const SEED_MARKER: &str = "/.daiv-sandbox/seeded";

/// The abstract socket the helper's `init` serves background processes on (per network
/// namespace, so one per sandbox).
pub const PROCESSES_SOCKET: &str = "daiv-sandbox-processes";

// === egress: the gateway's CA, root's ===

/// The egress CA certificate, installed with the sandbox.
pub const CA_CERT: &str = "/usr/local/share/daiv-sandbox/egress-ca.crt";
/// The image's system roots plus the egress CA, built at start-up; the sandbox's
/// `SSL_CERT_FILE` and friends point at it.
pub const CA_BUNDLE: &str = "/usr/local/share/daiv-sandbox/ca-bundle.pem";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_nest_as_documented() {
        for p in [REPO, SKILLS, TMP] {
            assert_eq!(p.rsplit_once('/').map(|(d, _)| d), Some(WORKSPACE), "{p}");
        }
        for p in [HELPER, HELPER_DIR, SESSION_DIR, SEED_MARKER] {
            assert_eq!(p.rsplit_once('/').map(|(d, _)| d), Some(SERVICE_DIR), "{p}");
        }
        assert_eq!(ENV_FILE.rsplit_once('/').map(|(d, _)| d), Some(SESSION_DIR));
    }
}
