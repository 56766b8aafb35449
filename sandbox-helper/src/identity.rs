//! Who the helper runs as, and how it acts for the sandbox user.
//!
//! Commands run as the sandbox user (`RUN_UID:RUN_GID`). If the helper ran under that uid too, a
//! command could signal, stop or ptrace it, or open its pipes through `/proc/PID/fd` and answer
//! the control plane in its place. So the container starts as root, and `init` and `serve` take
//! a uid of their own ([`assume`]) at once, keeping exactly three capabilities: `SETUID` and
//! `SETGID` to start commands and processes as the sandbox user, `KILL` to stop their process
//! groups. A command (other uid, no capabilities after its `execve`) can then neither signal the
//! helper nor pass the kernel's ptrace-access check on it (which compares real, effective and
//! saved uids), under runc and under gVisor alike.
//!
//! Workspace operations still run with the sandbox user's rights: each runs on a thread of its
//! own that [`Identity::act_as_sandbox_user`] switches to the sandbox user's effective ids, real
//! and saved ids staying the helper's (so a command still cannot signal or trace that thread),
//! then gives up its capabilities. Files it creates belong to the sandbox user and every
//! permission check is the sandbox user's. (gVisor has no `setfsuid`, hence the effective ids.)
//!
//! Without [`assume`] (tests, and sessions created before the helper had a uid of its own) the
//! helper acts as whoever started it, as it always did: [`Identity::Inherited`]. The identity is
//! a value the server and the supervisor are configured with, not a global.

use std::io;
use std::process::Command;

use rustix::process::{Gid, Uid};
use rustix::thread::{CapabilitySet, CapabilitySets};

/// A `uid:gid` pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    pub uid: u32,
    pub gid: u32,
}

impl Ids {
    /// `"uid:gid"`, both numeric.
    pub fn parse(s: &str) -> Option<Ids> {
        let (u, g) = s.split_once(':')?;
        Some(Ids {
            uid: u.parse().ok()?,
            gid: g.parse().ok()?,
        })
    }
}

impl std::fmt::Display for Ids {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.uid, self.gid)
    }
}

/// What the helper keeps: starting commands as the sandbox user, and killing their groups.
const KEPT: CapabilitySet = CapabilitySet::SETUID
    .union(CapabilitySet::SETGID)
    .union(CapabilitySet::KILL);

fn uid(n: u32) -> Uid {
    Uid::from_raw(n)
}

fn gid(n: u32) -> Gid {
    Gid::from_raw(n)
}

/// Who the helper is, and whom it acts for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Identity {
    /// Whoever started the helper; commands and workspace operations run as it too.
    #[default]
    Inherited,
    /// A uid of the helper's own, acting for the sandbox user (see [`assume`]).
    Own { helper: Ids, sandbox: Ids },
}

/// Leaves root for `helper`, keeping `KEPT`, to act for `sandbox`. Call it first thing, while
/// the process has one thread (the ids are set per thread, as the kernel keeps them).
pub fn assume(helper: Ids, sandbox: Ids) -> io::Result<Identity> {
    if helper.uid == 0 || helper.uid == sandbox.uid {
        return Err(io::Error::other(format!(
            "the helper's uid {} must be neither root nor the sandbox user's",
            helper.uid
        )));
    }
    if !rustix::process::getuid().is_root() {
        return Err(io::Error::other(
            "the helper must start as root to take a uid of its own",
        ));
    }
    rustix::thread::set_thread_groups(&[])?;
    rustix::thread::set_thread_res_gid(gid(helper.gid), gid(helper.gid), gid(helper.gid))?;
    // Leaving uid 0 would clear the permitted set; keep it across the switch, then trim it.
    rustix::thread::set_keep_capabilities(true)?;
    rustix::thread::set_thread_res_uid(uid(helper.uid), uid(helper.uid), uid(helper.uid))?;
    rustix::thread::set_keep_capabilities(false)?;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: KEPT,
            permitted: KEPT,
            inheritable: CapabilitySet::empty(),
        },
    )?;
    // Nothing may reach a command through `execve`. (gVisor has no ambient set: EINVAL.)
    match rustix::thread::clear_ambient_capability_set() {
        Ok(()) | Err(rustix::io::Errno::INVAL) => {}
        Err(e) => return Err(e.into()),
    }
    // Leaving root already made the process non-dumpable; say it once more, explicitly.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
    Ok(Identity::Own { helper, sandbox })
}

impl Identity {
    /// The sandbox user commands run as, when it is not the helper's own.
    pub fn sandbox_user(&self) -> Option<Ids> {
        match self {
            Identity::Inherited => None,
            Identity::Own { sandbox, .. } => Some(*sandbox),
        }
    }

    /// Makes the calling thread act with the sandbox user's rights for the rest of its life:
    /// its effective ids become the sandbox user's (real and saved stay the helper's), then it
    /// drops its capabilities. A no-op for [`Identity::Inherited`]. Call it at the start of a
    /// thread of its own.
    pub fn act_as_sandbox_user(&self) -> io::Result<()> {
        let Identity::Own { helper, sandbox } = self else {
            return Ok(());
        };
        rustix::thread::set_thread_groups(&[])?;
        rustix::thread::set_thread_res_gid(gid(helper.gid), gid(sandbox.gid), gid(helper.gid))?;
        rustix::thread::set_thread_res_uid(uid(helper.uid), uid(sandbox.uid), uid(helper.uid))?;
        rustix::thread::set_capabilities(
            None,
            CapabilitySets {
                effective: CapabilitySet::empty(),
                permitted: CapabilitySet::empty(),
                inheritable: CapabilitySet::empty(),
            },
        )?;
        Ok(())
    }

    /// `program` as a command the sandbox user runs (with no supplementary groups and, after
    /// its `execve`, no capabilities); as the helper's own user when [`Identity::Inherited`].
    pub fn sandbox_command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(program);
        if let Some(s) = self.sandbox_user() {
            cmd.uid(s.uid).gid(s.gid);
        }
        cmd
    }

    /// Whether a peer of a unix socket may speak to the helper: with a uid of its own, only that
    /// uid (`serve` and `init` talk to each other; commands never); anyone otherwise.
    pub fn trusts_peer(&self, peer_uid: u32) -> bool {
        match self {
            Identity::Inherited => true,
            Identity::Own { helper, .. } => peer_uid == helper.uid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Identity, Ids};

    #[test]
    fn only_the_helpers_own_uid_is_a_trusted_peer() {
        let own = Identity::Own {
            helper: Ids { uid: 999, gid: 999 },
            sandbox: Ids {
                uid: 1000,
                gid: 1000,
            },
        };
        assert!(own.trusts_peer(999));
        assert!(!own.trusts_peer(1000), "the sandbox user is never trusted");
        assert!(!own.trusts_peer(0));
        assert_eq!(own.sandbox_user().map(|s| s.uid), Some(1000));
        assert!(Identity::Inherited.trusts_peer(1000));
        assert_eq!(Identity::Inherited.sandbox_user(), None);
    }

    #[test]
    fn ids_are_numeric_pairs() {
        assert_eq!(
            Ids::parse("1000:1001"),
            Some(Ids {
                uid: 1000,
                gid: 1001
            })
        );
        for bad in ["1000", "a:b", "1000:", ":1", "-1:0", "1:2:3"] {
            assert_eq!(Ids::parse(bad), None, "{bad}");
        }
        assert_eq!(Ids { uid: 7, gid: 8 }.to_string(), "7:8");
    }
}
