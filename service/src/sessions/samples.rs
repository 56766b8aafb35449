//! Metrics per session: every `SESSION_METRICS_INTERVAL_SECONDS` each running session of this
//! engine is sampled (its CPU and memory from the engine's reading of its cgroup, its workspace's
//! disk from its helper), and the last `SESSION_METRICS_SAMPLES` samples are kept in this
//! replica's memory: at most that many [`MetricsSample`]s (64 bytes each) per running session,
//! dropped with the session. No per-session label ever reaches `/metrics`.
//!
//! The CPU figure is a rate: the first reading of a session starts its series, the next one makes
//! its first sample. The disk is a walk of the workspace by the helper, inside the sandbox (its
//! CPU is the session's): it is read every [`DISK_EVERY`]th sample and carried in between. A
//! replica answers from its own samples; one that has none for a running session (just started,
//! or sampling off) takes one as it is asked.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt;
use tokio::task::JoinHandle;

use crate::api::MetricsSample;
use crate::engine::{ContainerInfo, DEPLOYMENT_LABEL, ROLE_LABEL, ROLE_SANDBOX};
use crate::time::unix_millis;

use super::{SessionError, SessionId, Sessions};

/// Sessions sampled side by side.
const CONCURRENCY: usize = 4;
/// The disk is read at one sample of this many (and at a series' first).
const DISK_EVERY: u64 = 6;
/// Between the two readings of a sample taken on demand.
const ON_DEMAND_GAP: Duration = Duration::from_millis(250);

/// Each session's series in this replica.
#[derive(Default)]
pub struct Samples {
    series: Mutex<HashMap<String, Series>>,
}

#[derive(Default)]
struct Series {
    /// The last CPU reading: (unix ms, CPU ns).
    last_cpu: Option<(i64, u64)>,
    /// The last disk reading (used, total) and how many samples ago it was taken.
    disk: Option<(u64, u64, u64)>,
    readings: u64,
    kept: VecDeque<MetricsSample>,
}

impl Samples {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Series>) -> T) -> T {
        f(&mut self.series.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Sessions {
    /// Samples every running session of this engine every `every` until the task is aborted.
    pub fn spawn_sampler(self: std::sync::Arc<Self>, every: Duration) -> JoinHandle<()> {
        crate::background::spawn(std::sync::Arc::new(Sampler {
            sessions: self,
            every: every.max(Duration::from_millis(100)),
        }))
    }

    /// One round: a sample of each running session; the series of sessions gone are dropped.
    pub async fn sample_all(&self) {
        let filter = [
            (ROLE_LABEL, ROLE_SANDBOX),
            (DEPLOYMENT_LABEL, self.config().deployment.as_str()),
        ];
        let listed = match self.engine().list(&filter).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "session metrics: listing failed");
                return;
            }
        };
        let running: Vec<ContainerInfo> = listed
            .into_iter()
            .filter(|c| c.is_running() && !crate::pool::is_unclaimed(c))
            .collect();
        let live: HashSet<String> = running.iter().map(|c| c.id.clone()).collect();
        self.samples.with(|s| s.retain(|id, _| live.contains(id)));
        let cap = self.config().sessions.metrics_samples;
        let reads = running
            .into_iter()
            .map(|c| Box::pin(async move { self.read(&c, cap).await.is_some() }));
        futures::stream::iter(reads)
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
    }

    /// Reads session `c` once, keeping the sample it makes (none for a first reading).
    async fn read(&self, c: &ContainerInfo, cap: usize) -> Option<MetricsSample> {
        let id = c.id.as_str();
        let disk_due = self.samples.with(|s| {
            let series = s.entry(id.to_string()).or_default();
            series.disk.is_none_or(|(_, _, age)| age + 1 >= DISK_EVERY)
        });
        let (stats, disk) = tokio::join!(self.engine().stats(id), async {
            match disk_due {
                true => self.runtime.disk(id).await.ok(),
                false => None,
            }
        });
        let stats = stats.ok().flatten()?;
        let at = unix_millis();
        let (_, nano_cpus) = super::inventory::limits(c);
        let cpu_count = match nano_cpus {
            Some(n) if n > 0 => crate::api::cpus_of(n),
            _ => f64::from(stats.online_cpus.max(1)),
        };
        self.samples.with(|s| {
            let series = s.entry(id.to_string()).or_default();
            series.readings += 1;
            series.disk = match (disk, series.disk) {
                (Some(d), _) => Some((d.used_bytes, d.total_bytes, 0)),
                (None, Some((used, total, age))) => Some((used, total, age + 1)),
                (None, None) => None,
            };
            let previous = series.last_cpu.replace((at, stats.cpu_total_ns));
            let (then, cpu_then) = previous?;
            let wall_ns = (at - then).max(1) as f64 * 1e6;
            let used_ns = stats.cpu_total_ns.saturating_sub(cpu_then) as f64;
            let (disk_used, disk_total) = series
                .disk
                .map(|(used, total, _)| (used, total))
                .unwrap_or_default();
            let sample = MetricsSample {
                timestamp_unix: at / 1000,
                cpu_count,
                cpu_used_pct: (used_ns / wall_ns / cpu_count * 100.0).clamp(0.0, 100.0),
                mem_used: stats.mem_usage.saturating_sub(stats.mem_cache),
                mem_total: stats.mem_limit,
                mem_cache: stats.mem_cache,
                disk_used,
                disk_total,
            };
            series.kept.push_back(sample);
            while series.kept.len() > cap {
                series.kept.pop_front();
            }
            Some(sample)
        })
    }

    /// `GET /session/{id}/metrics/`: the samples taken within `start..=end` (Unix seconds). A
    /// running session without any yet is sampled now.
    pub async fn metrics(
        &self,
        id: &SessionId,
        start: Option<i64>,
        end: Option<i64>,
    ) -> Result<Vec<MetricsSample>, SessionError> {
        let info = self.find(id).await?;
        let cap = self.config().sessions.metrics_samples;
        let none_yet = self.samples.with(|s| {
            s.get(id.as_str())
                .is_none_or(|series| series.kept.is_empty())
        });
        if none_yet && info.is_running() {
            // Two readings: a rate needs both.
            if self.read(&info, cap).await.is_none() {
                tokio::time::sleep(ON_DEMAND_GAP).await;
                self.read(&info, cap).await;
            }
        }
        let (from, to) = (start.unwrap_or(i64::MIN), end.unwrap_or(i64::MAX));
        Ok(self.samples.with(|s| {
            s.get(id.as_str())
                .map(|series| {
                    series
                        .kept
                        .iter()
                        .filter(|x| (from..=to).contains(&x.timestamp_unix))
                        .copied()
                        .collect()
                })
                .unwrap_or_default()
        }))
    }
}

/// The samples' rounds, the first one interval in (none at start-up, beside everything else).
struct Sampler {
    sessions: std::sync::Arc<Sessions>,
    every: Duration,
}

impl crate::background::Background for Sampler {
    fn name(&self) -> &'static str {
        "session metrics"
    }

    async fn round(self: std::sync::Arc<Self>) -> std::ops::ControlFlow<()> {
        self.sessions.sample_all().await;
        std::ops::ControlFlow::Continue(())
    }

    async fn pause(&self) {
        tokio::time::sleep(self.every).await;
    }

    fn waits_first(&self) -> bool {
        true
    }
}
