//! What a command or background process cost ([`Usage`]): its wall time, the CPU time of its
//! process tree and its peak resident memory.
//!
//! The workspace forbids `unsafe` and `rustix` has no `wait4` with its `rusage`, so the same
//! figures are read from `/proc` instead:
//! - CPU: once the shell has exited but before it is reaped (`waitid(WEXITED | WNOWAIT)`), its
//!   zombie's `/proc/PID/stat` holds `utime + stime` and `cutime + cstime`, the times of every
//!   descendant it waited for: exactly what `wait4`'s `ru_utime + ru_stime` would say.
//! - Peak memory: `VmHWM` (under gVisor, which has none, `VmRSS`) of each process of the
//!   command's process group, sampled while it runs
//!   (at most every [`SAMPLE_EVERY`]), the largest kept (`wait4`'s `ru_maxrss` is also the
//!   largest process's peak). The first sample is taken right after the spawn (the shell already
//!   exec'd), so a command that ends at once still has a figure (a lower bound); a process that
//!   lives and dies between two samples is missed.

use std::time::{Duration, Instant};

use rustix::process::{Pid, WaitId, WaitIdOptions};
use sandbox_protocol::message::Usage;

/// How often a running command's process group is sampled for its peak memory.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// `/proc`'s clock tick (`USER_HZ`, 100 on every Linux architecture and in gVisor).
const TICKS_PER_SEC: u64 = 100;

/// Measures one command from its start.
pub struct Meter {
    started: Instant,
    pgid: i32,
    peak_kib: Option<u64>,
    last: Option<Instant>,
}

impl Meter {
    /// Starts measuring the process group `pgid` (the shell's pid).
    pub fn start(pgid: i32) -> Meter {
        Meter {
            started: Instant::now(),
            pgid,
            peak_kib: None,
            last: None,
        }
    }

    /// Samples the group's peak memory, unless it was sampled less than [`SAMPLE_EVERY`] ago.
    pub fn sample(&mut self) {
        let now = Instant::now();
        if self.last.is_some_and(|l| now - l < SAMPLE_EVERY) {
            return;
        }
        self.last = Some(now);
        if let Some(kib) = group_peak_kib(self.pgid) {
            self.peak_kib = Some(self.peak_kib.map_or(kib, |p| p.max(kib)));
        }
    }

    /// The figures, once the shell `pid` has exited and before it is reaped (see [`exited`]).
    pub fn finish(&mut self, pid: i32) -> Usage {
        self.last = None;
        self.sample();
        Usage {
            duration_ms: Some(
                u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            ),
            cpu_ms: tree_cpu_ms(pid),
            max_rss_bytes: self.peak_kib.map(|k| k.saturating_mul(1024)),
        }
    }
}

/// Whether child `pid` has exited, leaving it unreaped; `block` waits for it.
pub fn exited(pid: i32, block: bool) -> bool {
    let Some(p) = Pid::from_raw(pid) else {
        return true;
    };
    let mut opts = WaitIdOptions::EXITED | WaitIdOptions::NOWAIT;
    if !block {
        opts |= WaitIdOptions::NOHANG;
    }
    loop {
        match rustix::process::waitid(WaitId::Pid(p), opts) {
            Ok(Some(_)) => return true,
            Ok(None) => return false,
            Err(rustix::io::Errno::INTR) => {}
            // Not our child, or already reaped: nothing to wait for.
            Err(_) => return true,
        }
    }
}

/// The fields of `/proc/PID/stat` after the command name (the first is field 3, the state).
fn stat_fields(pid: i32) -> Option<Vec<u64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(
        rest.split_whitespace()
            .map(|f| f.parse::<u64>().unwrap_or(0))
            .collect(),
    )
}

/// `utime + stime + cutime + cstime` of `pid` (fields 14–17), in milliseconds.
fn tree_cpu_ms(pid: i32) -> Option<u64> {
    let f = stat_fields(pid)?;
    let ticks: u64 = f.get(11..15)?.iter().sum();
    Some(ticks * 1000 / TICKS_PER_SEC)
}

/// The largest `VmHWM` among the processes of group `pgid`, in KiB.
fn group_peak_kib(pgid: i32) -> Option<u64> {
    // The leader (the shell) first: a short command may be gone by the end of the scan.
    let mut peak = peak_kib(pgid);
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        // Field 5, the process group.
        if pid == pgid
            || stat_fields(pid).and_then(|f| f.get(2).copied()) != u64::try_from(pgid).ok()
        {
            continue;
        }
        if let Some(kib) = peak_kib(pid) {
            peak = Some(peak.map_or(kib, |p: u64| p.max(kib)));
        }
    }
    peak
}

/// `VmHWM` of `pid`, in KiB, else its `VmRSS` (gVisor's `/proc` has no `VmHWM`: the sampled
/// resident size is then the peak as far as the samples saw it). Absent for a zombie.
fn peak_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    field("VmHWM:").or_else(|| field("VmRSS:"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn a_commands_cpu_and_memory_are_measured_before_it_is_reaped() {
        // Busy for a while, the shell holding 8 MB in a variable.
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "x=$(head -c 8000000 /dev/zero | tr '\\0' a); i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 0.2",
            ])
            .process_group(0)
            .spawn()
            .expect("spawn");
        let pid = i32::try_from(child.id()).expect("pid");
        let mut meter = Meter::start(pid);
        while !exited(pid, false) {
            meter.sample();
            std::thread::sleep(Duration::from_millis(5));
        }
        let usage = meter.finish(pid);
        assert!(child.wait().expect("reap").success());
        assert!(usage.duration_ms.is_some());
        assert!(usage.cpu_ms.is_some_and(|c| c > 0), "{usage:?}");
        assert!(
            usage.max_rss_bytes.is_some_and(|r| r > 8_000_000),
            "{usage:?}"
        );
        // After the reap nothing is left to read.
        assert!(exited(pid, false));
    }
}
