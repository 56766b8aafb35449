//! The probes of the sandboxes' runtime: does what agents run work under it?
//!
//! Under `runsc` (gVisor), a probe starts a throwaway container from an image, runs `ls /` and
//! `stat /` in it as the sandbox user, and removes it, pass, fail or time-out. It runs
//! - for each image sessions use ([`ImageProbes`]): on the image's first session on each engine,
//!   in the background (the create does not wait), once however many sessions of it arrive
//!   meanwhile, kept by image id (a tag moved to another image is probed again), at most
//!   [`MAX_IMAGES_PER_ENGINE`] per engine;
//! - at start-up, in `RUNTIME_PROBE_IMAGE` (else the first warm-pool image), when set.
//!
//! What it found is logged (an error naming the image, the failing commands and the fix when
//! the runtime is not sound), served in `/-/health/` under `runtime` (each image under
//! `images`), exported as `daiv_sandbox_runtime_sound{runtime}` and
//! `daiv_sandbox_runtime_probed_images{runtime,verdict}`, and shown to clients as the
//! `runtime_warning` of a session of an unsound image. It never stops the service: it tells.
//!
//! Why: gVisor before release-20230227.0 answers `statx(2)` with `AT_NO_AUTOMOUNT` (which GNU
//! coreutils 9.1's `ls` and `stat` pass) with EINVAL, so in a Debian 12 image an agent cannot list
//! a directory, while busybox, Python and `find` work (gVisor commit 7a0c4b5, "Ignore
//! AT_NO_AUTOMOUNT flag in statx() calls"; Debian 12's `runsc` package is release-20221219.0).
//!
//! [`judge`] is the decision, pure; [`probe`] runs it through the [`ContainerEngine`] seam;
//! [`RuntimeHealth`] holds the verdicts for the health route, the sessions and the metrics.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use futures::StreamExt;
use prometheus_client::metrics::family::Family;
use tokio::task::JoinHandle;

use crate::api::{ImageSoundness, RuntimeSoundness};
use crate::config::{Config, Runtime};
use crate::engine::{
    ContainerEngine, ContainerSpec, DEPLOYMENT_LABEL, EngineError, ExecSpec, IMAGE_LABEL,
    NetworkAttach, ROLE_LABEL,
};
use crate::telemetry::metrics::{Gauge, ImageVerdictLabels, Metrics, RuntimeLabels};

/// The probe container's role label (it carries the deployment's label too, not the managed
/// one: no reaper, pool or session listing ever sees it).
pub const ROLE_RUNTIME_PROBE: &str = "runtime-probe";
/// The longest a probe may take, image pull included.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(120);
/// The longest the removal of the probe container may take.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(30);
/// The first gVisor release whose `statx` accepts `AT_NO_AUTOMOUNT`.
pub const RUNSC_FIXED_RELEASE: &str = "release-20230227.0";

/// The checks, each printing `<name>\t<exit code>\t<first line of its stderr>`.
const SCRIPT: &str = r#"check() {
  name=$1; shift
  err=$("$@" 2>&1 >/dev/null); rc=$?
  first=${err%%
*}
  printf '%s\t%s\t%s\n' "$name" "$rc" "$first"
}
check ls ls /
check stat stat /
"#;

/// How long the checks' output may stall once one of them failed.
const STALLED: Duration = Duration::from_secs(10);

/// Whether a check's line in `output` says it failed.
fn any_failed(output: &str) -> bool {
    output.lines().any(|l| {
        let mut parts = l.split('\t');
        matches!((parts.next(), parts.next()), (Some(name), Some(rc)) if CHECKS.contains(&name) && rc != "0")
    })
}

/// The commands the probe runs, by the name its output gives them.
pub const CHECKS: [&str; 2] = ["ls", "stat"];

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every check passed.
    Sound,
    /// Some checks failed: which, and why in words an operator can act on.
    Unsound {
        reason: String,
        failing: Vec<String>,
    },
    /// The probe could not tell (no image, the image absent, the engine failing, a time-out).
    Unknown { reason: String },
}

/// The verdict on the probe script's output.
pub fn judge(output: &str) -> Verdict {
    let mut failed: Vec<(String, String, String)> = Vec::new();
    for name in CHECKS {
        let line = output.lines().find(|l| l.split('\t').next() == Some(name));
        // A check that failed took the sandbox with it (seen: this runsc dies answering `stat`
        // after `ls` failed): what failed decides, and the checks that never answered fail too.
        let Some(line) = line else {
            if !failed.is_empty() {
                failed.push((
                    name.to_string(),
                    "?".to_string(),
                    "no answer: the sandbox stopped answering".to_string(),
                ));
                continue;
            }
            return Verdict::Unknown {
                reason: format!(
                    "the probe's output has no result for `{name}`: {:?}",
                    crate::text::shown(output.trim())
                ),
            };
        };
        let mut parts = line.splitn(3, '\t');
        let (_, rc, err) = (parts.next(), parts.next(), parts.next().unwrap_or(""));
        if rc != Some("0") {
            failed.push((
                name.to_string(),
                rc.unwrap_or("?").to_string(),
                crate::text::shown(err.trim()),
            ));
        }
    }
    if failed.is_empty() {
        return Verdict::Sound;
    }
    let failing: Vec<String> = failed.iter().map(|(n, _, _)| n.clone()).collect();
    let seen = failed
        .iter()
        .map(|(n, rc, err)| format!("`{n} /` exited {rc}: {err}"))
        .collect::<Vec<_>>()
        .join("; ");
    let reason = if failed
        .iter()
        .any(|(_, _, e)| e.contains("Invalid argument"))
    {
        format!(
            "gVisor's statx returns EINVAL: GNU coreutils 9 ls/stat fail ({seen}); runsc \
             {RUNSC_FIXED_RELEASE} or later fixes it (statx accepts AT_NO_AUTOMOUNT)"
        )
    } else {
        format!("commands agents run fail under the runtime ({seen})")
    };
    Verdict::Unsound { reason, failing }
}

/// Unsound when the engine does not offer `runtime` at all: no session could start.
pub fn lacks_runtime(runtimes: &[String], runtime: &str) -> Option<Verdict> {
    (!runtimes.iter().any(|r| r == runtime)).then(|| Verdict::Unsound {
        reason: format!(
            "the engine has no {runtime} runtime: no session can start (register it in the \
             daemon's runtimes; scripts/ensure-gvisor.sh does)"
        ),
        failing: CHECKS.map(String::from).to_vec(),
    })
}

/// The image the probe runs in: `RUNTIME_PROBE_IMAGE`, else the first warm-pool image.
pub fn probe_image(config: &Config) -> Option<String> {
    config.sessions.runtime_probe_image.clone().or_else(|| {
        config
            .pool
            .isolated
            .iter()
            .chain(&config.pool.egress)
            .map(|(image, _)| image.clone())
            .next()
    })
}

/// Runs the checks in a throwaway container of `image` under the configured runtime, within
/// `within`; the container is removed whatever happens.
pub async fn probe(
    engine: &dyn ContainerEngine,
    config: &Config,
    image: &str,
    within: Duration,
) -> Verdict {
    let started = Instant::now();
    match probe_once(engine, config, image, within).await {
        // Seen with runsc release-20221219.0: the sandbox dies under the checks now and then
        // before any answer gets out. Once more; twice is the runtime's answer.
        Attempt::DiedSilent => {
            let left = within.saturating_sub(started.elapsed());
            match probe_once(engine, config, image, left).await {
                Attempt::Judged(v) => v,
                Attempt::DiedSilent => Verdict::Unsound {
                    reason: format!(
                        "the sandbox stopped while `ls /` and `stat /` ran, before either \
                         answered, twice: commands agents run take the sandbox down under this \
                         runtime (gVisor releases before {RUNSC_FIXED_RELEASE} do when their \
                         statx fails)"
                    ),
                    failing: CHECKS.map(String::from).to_vec(),
                },
            }
        }
        Attempt::Judged(v) => v,
    }
}

/// What one probe came to.
enum Attempt {
    Judged(Verdict),
    /// The sandbox stopped before any check answered.
    DiedSilent,
}

/// How long the checks may print nothing before the probe looks whether the sandbox still
/// runs.
const WATCH: Duration = Duration::from_millis(500);
/// How long output still in flight may take once the sandbox stopped.
const GRACE: Duration = Duration::from_secs(1);

async fn probe_once(
    engine: &dyn ContainerEngine,
    config: &Config,
    image: &str,
    within: Duration,
) -> Attempt {
    let runtime = config.sessions.runtime.as_str();
    let name = format!("daiv-sandbox-probe-{:016x}", rand::random::<u64>());
    let created: Mutex<Option<String>> = Mutex::new(None);
    let run = async {
        if let Some(missing) = lacks_runtime(&engine.info().await?.runtimes, runtime) {
            return Ok(Attempt::Judged(missing));
        }
        // An image id is one a session already runs (nothing to pull, and never a name).
        if !crate::engine::reference::is_image_id(image) {
            engine.ensure_image(image).await?;
        }
        let user = format!("{}:{}", config.sessions.run_uid, config.sessions.run_gid);
        let spec = probe_spec(config, &name, image, &user);
        let id = engine.create(&spec).await?;
        *created.lock().unwrap_or_else(|e| e.into_inner()) = Some(id.clone());
        engine.start(&id).await?;
        let exec = ExecSpec {
            cmd: vec!["/bin/sh".into(), "-c".into(), SCRIPT.into()],
            user,
            workdir: None,
            env: Vec::new(),
        };
        let mut stream = engine.exec(&id, &exec).await?;
        let mut out = Vec::new();
        let mut stopped = false;
        let mut last_output = Instant::now();
        loop {
            // Every WATCH without output, a look at the sandbox: one that stopped has said all
            // it will (output in flight gets GRACE). Once a check failed, a sandbox that stays
            // silent for STALLED has said enough too (a runtime that dies under a check can
            // leave the exec hanging while the container lingers).
            let wait = if stopped { GRACE } else { WATCH };
            match tokio::time::timeout(wait, stream.output.next()).await {
                Ok(Some(chunk)) => {
                    out.extend_from_slice(&chunk?);
                    last_output = Instant::now();
                    if out.len() > 64 * 1024 {
                        break;
                    }
                }
                Ok(None) => break,
                Err(_) if stopped => break,
                Err(_)
                    if any_failed(&String::from_utf8_lossy(&out))
                        && last_output.elapsed() >= STALLED =>
                {
                    break;
                }
                Err(_) => match engine.inspect(&id).await {
                    Ok(info) if info.is_running() => {}
                    Ok(_) | Err(EngineError::NotFound) => stopped = true,
                    Err(e) => return Err(e),
                },
            }
        }
        let out = String::from_utf8_lossy(&out);
        if stopped
            && !out
                .lines()
                .any(|l| CHECKS.contains(&l.split('\t').next().unwrap_or("")))
        {
            return Ok(Attempt::DiedSilent);
        }
        Ok::<_, EngineError>(Attempt::Judged(judge(&out)))
    };
    let attempt = match tokio::time::timeout(within, run).await {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, image, "runtime probe: engine call failed");
            Attempt::Judged(Verdict::Unknown {
                reason: format!("the probe could not run in {image}: {}", e.public()),
            })
        }
        Err(_) => Attempt::Judged(Verdict::Unknown {
            reason: format!(
                "the probe in {image} did not finish within {} s",
                within.as_secs()
            ),
        }),
    };
    // By id when the create answered; by name otherwise (a create cut by the time-out may
    // still have made it).
    let target = created
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .unwrap_or(name);
    match tokio::time::timeout(REMOVE_TIMEOUT, engine.remove(&target)).await {
        Ok(Ok(())) | Ok(Err(EngineError::NotFound)) => {}
        Ok(Err(e)) => {
            tracing::warn!(container = %target, error = %e, "runtime probe: container not removed")
        }
        Err(_) => tracing::warn!(container = %target, "runtime probe: removal timed out"),
    }
    attempt
}

/// A container like a sandbox as far as the checks can tell: the runtime, the sandbox user, no
/// capability, no network; it only sleeps until removed.
fn probe_spec(config: &Config, name: &str, image: &str, user: &str) -> ContainerSpec {
    ContainerSpec {
        name: Some(name.to_string()),
        image: image.to_string(),
        entrypoint: Some(vec!["sleep".into()]),
        cmd: Some(vec![PROBE_TIMEOUT.as_secs().to_string()]),
        env: Vec::new(),
        labels: [
            (ROLE_LABEL.to_string(), ROLE_RUNTIME_PROBE.to_string()),
            (DEPLOYMENT_LABEL.to_string(), config.deployment.clone()),
        ]
        .into(),
        user: Some(user.to_string()),
        cap_add: Vec::new(),
        sysctls: Vec::new(),
        init: true,
        runtime: config.sessions.runtime.as_str().to_string(),
        memory_bytes: Some(256 * 1024 * 1024),
        nano_cpus: None,
        pids_limit: 64,
        network: NetworkAttach::None,
        volumes: Vec::new(),
        named_volumes: Vec::new(),
        read_only_volumes: Vec::new(),
        host_dirs: Vec::new(),
        log_options: Vec::new(),
        // Removed by the engine when it ends (its own sleep, or a runtime that died under the
        // checks), should the service not live to remove it.
        auto_remove: true,
        skeleton: Vec::new(),
    }
}

/// One engine's start-up probe of a runtime.
#[derive(Debug, Clone)]
struct Probed {
    engine: String,
    image: Option<String>,
    /// `None` while probing.
    verdict: Option<Verdict>,
}

/// An image sessions used, on one engine, by its id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct ImageKey {
    runtime: &'static str,
    engine: String,
    image_id: String,
}

/// One image's probe: its verdict, once (every session of the image that arrives while it runs
/// waits for the same one).
struct ImageEntry {
    /// The image as the last session named it (a tag, for people; the key is the id).
    image: Mutex<String>,
    verdict: tokio::sync::OnceCell<(Verdict, Instant)>,
    /// When it was last used, on the cache's clock: the least recently used goes first.
    used: AtomicU64,
}

impl ImageEntry {
    fn done(&self) -> Option<&Verdict> {
        self.verdict.get().map(|(v, _)| v)
    }

    /// An `Unknown` verdict (the engine failing, a time-out) is tried again after a while; a
    /// sound or unsound one holds for the image's life.
    fn stale(&self) -> bool {
        matches!(self.verdict.get(), Some((Verdict::Unknown { .. }, at)) if at.elapsed() >= RETRY_UNKNOWN)
    }
}

/// The most images whose verdicts each engine keeps; past it, the least recently used is
/// forgotten (and probed again if a session uses it again).
pub const MAX_IMAGES_PER_ENGINE: usize = 256;
/// How long a verdict of "not known" stands before the image's next session probes again.
pub const RETRY_UNKNOWN: Duration = Duration::from_secs(300);

/// The probes' verdicts, per runtime and engine (the start-up probe's) and per image (each
/// image's, on its first use), for `/-/health/`, the sessions' warnings and the metrics.
pub struct RuntimeHealth {
    /// runtime → what each engine's start-up probe found.
    seen: Mutex<BTreeMap<&'static str, Vec<Probed>>>,
    /// The images probed, bounded per engine.
    images: Mutex<HashMap<ImageKey, Arc<ImageEntry>>>,
    clock: AtomicU64,
    gauge: Family<RuntimeLabels, Gauge>,
    counted: Family<ImageVerdictLabels, Gauge>,
}

impl RuntimeHealth {
    pub fn new(metrics: &Metrics) -> Self {
        Self {
            seen: Mutex::default(),
            images: Mutex::default(),
            clock: AtomicU64::new(0),
            gauge: metrics.runtime.sound.clone(),
            counted: metrics.runtime.images.clone(),
        }
    }

    /// A probe of `runtime` on `engine` has started (or has no image: then `verdict` says so).
    pub fn expect(&self, runtime: &'static str, engine: &str, image: Option<&str>) {
        self.set(runtime, engine, image, None);
    }

    /// Records what a start-up probe found, logs it and sets the metric.
    pub fn record(
        &self,
        runtime: &'static str,
        engine: &str,
        image: Option<&str>,
        verdict: Verdict,
    ) {
        log_verdict(runtime, engine, image, None, &verdict);
        self.set(runtime, engine, image, Some(verdict));
    }

    fn set(
        &self,
        runtime: &'static str,
        engine: &str,
        image: Option<&str>,
        verdict: Option<Verdict>,
    ) {
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            let list = seen.entry(runtime).or_default();
            list.retain(|p| p.engine != engine);
            list.push(Probed {
                engine: engine.to_string(),
                image: image.map(str::to_string),
                verdict,
            });
        }
        self.refresh(runtime);
    }

    /// The entry of image `image_id` on `engine` (named `image`), made when there is none or
    /// its "not known" went stale: the caller then probes it. A new entry may push the least
    /// recently used finished one of the engine out.
    fn image_entry(
        &self,
        runtime: &'static str,
        engine: &str,
        image: &str,
        image_id: &str,
    ) -> Arc<ImageEntry> {
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let key = ImageKey {
            runtime,
            engine: engine.to_string(),
            image_id: image_id.to_string(),
        };
        let mut images = self.images.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = images.get(&key).filter(|e| !e.stale()) {
            entry.used.store(now, Ordering::Relaxed);
            *entry.image.lock().unwrap_or_else(|e| e.into_inner()) = image.to_string();
            return entry.clone();
        }
        let entry = Arc::new(ImageEntry {
            image: Mutex::new(image.to_string()),
            verdict: tokio::sync::OnceCell::new(),
            used: AtomicU64::new(now),
        });
        images.insert(key, entry.clone());
        self.evict(&mut images, runtime, engine);
        drop(images);
        // A running probe counts as not known meanwhile.
        self.refresh(runtime);
        entry
    }

    /// Past [`MAX_IMAGES_PER_ENGINE`] on `engine`, its least recently used finished entry goes.
    fn evict(
        &self,
        images: &mut HashMap<ImageKey, Arc<ImageEntry>>,
        runtime: &'static str,
        engine: &str,
    ) {
        let mine: Vec<(&ImageKey, &Arc<ImageEntry>)> = images
            .iter()
            .filter(|(k, _)| k.runtime == runtime && k.engine == engine)
            .collect();
        if mine.len() > MAX_IMAGES_PER_ENGINE
            && let Some(oldest) = mine
                .iter()
                .filter(|(_, e)| e.done().is_some())
                .min_by_key(|(_, e)| e.used.load(Ordering::Relaxed))
                .map(|(k, _)| (*k).clone())
        {
            images.remove(&oldest);
        }
    }

    /// What the probe found of image `image_id` on `engine`, when it finished.
    pub fn image_verdict(&self, engine: &str, image_id: &str) -> Option<Verdict> {
        let images = self.images.lock().unwrap_or_else(|e| e.into_inner());
        images
            .iter()
            .find(|(k, _)| k.engine == engine && k.image_id == image_id)
            .and_then(|(_, e)| e.done().cloned())
    }

    /// Whether any image probed on `engine` was found unsound (what decides if a request looks
    /// up its session's image at all).
    pub fn any_unsound(&self, engine: &str) -> bool {
        let images = self.images.lock().unwrap_or_else(|e| e.into_inner());
        images
            .iter()
            .any(|(k, e)| k.engine == engine && matches!(e.done(), Some(Verdict::Unsound { .. })))
    }

    /// Logs what the probe of an image found and sets the metrics.
    fn image_probed(
        &self,
        runtime: &'static str,
        engine: &str,
        image: &str,
        image_id: &str,
        verdict: &Verdict,
    ) {
        log_verdict(runtime, engine, Some(image), Some(image_id), verdict);
        self.refresh(runtime);
    }

    /// The images of `runtime` as the report shows them, by engine and image.
    fn image_views(&self, runtime: &str) -> Vec<ImageSoundness> {
        let images = self.images.lock().unwrap_or_else(|e| e.into_inner());
        let mut views: Vec<ImageSoundness> = images
            .iter()
            .filter(|(k, _)| k.runtime == runtime)
            .map(|(k, e)| {
                let (sound, reason, failing) = parts(e.done(), "the probe is running");
                ImageSoundness {
                    image: e.image.lock().unwrap_or_else(|e| e.into_inner()).clone(),
                    image_id: k.image_id.clone(),
                    engine: k.engine.clone(),
                    sound,
                    reason,
                    failing,
                }
            })
            .collect();
        views.sort_by(|a, b| {
            (&a.engine, &a.image, &a.image_id).cmp(&(&b.engine, &b.image, &b.image_id))
        });
        views
    }

    /// Sets `runtime_sound` and `runtime_probed_images` from what is known now.
    fn refresh(&self, runtime: &'static str) {
        let soundness = self.soundness(runtime);
        let label = RuntimeLabels { runtime };
        match soundness.sound {
            Some(sound) => {
                self.gauge.get_or_create(&label).set(u64::from(sound));
            }
            None => {
                self.gauge.remove(&label);
            }
        }
        for verdict in ["sound", "unsound", "unknown"] {
            let n = soundness
                .images
                .iter()
                .filter(|i| {
                    verdict
                        == match i.sound {
                            Some(true) => "sound",
                            Some(false) => "unsound",
                            None => "unknown",
                        }
                })
                .count();
            self.counted
                .get_or_create(&ImageVerdictLabels { runtime, verdict })
                .set(n as u64);
        }
    }

    fn soundness(&self, runtime: &str) -> RuntimeSoundness {
        let startup = {
            let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.get(runtime).cloned().unwrap_or_default()
        };
        aggregate(&startup, self.image_views(runtime))
    }

    /// The `runtime` field of `/-/health/`.
    pub fn report(&self) -> BTreeMap<String, RuntimeSoundness> {
        let mut runtimes: Vec<&'static str> = {
            let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.keys().copied().collect()
        };
        {
            let images = self.images.lock().unwrap_or_else(|e| e.into_inner());
            runtimes.extend(images.keys().map(|k| k.runtime));
        }
        runtimes.sort_unstable();
        runtimes.dedup();
        runtimes
            .into_iter()
            .map(|runtime| (runtime.to_string(), self.soundness(runtime)))
            .collect()
    }
}

/// The log line of a verdict: an error naming the image, the failing commands and the fix when
/// the runtime is not sound.
fn log_verdict(
    runtime: &str,
    engine: &str,
    image: Option<&str>,
    image_id: Option<&str>,
    verdict: &Verdict,
) {
    match verdict {
        Verdict::Sound => {
            tracing::info!(
                runtime,
                engine,
                image,
                image_id,
                "runtime probe: ls and stat work"
            )
        }
        Verdict::Unsound { reason, failing } => tracing::error!(
            runtime,
            engine,
            image,
            image_id,
            failing = %failing.join(","),
            "runtime probe: the runtime is not sound{}: {} fail: {reason}",
            image.map(|i| format!(" in image {i}")).unwrap_or_default(),
            failing.join(", "),
        ),
        // Nothing probed yet is no fault.
        Verdict::Unknown { reason } if image.is_none() => {
            tracing::info!(runtime, engine, "runtime probe: not known: {reason}")
        }
        Verdict::Unknown { reason } => {
            tracing::warn!(
                runtime,
                engine,
                image,
                image_id,
                "runtime probe: not known: {reason}"
            )
        }
    }
}

/// A verdict as the report gives it: sound, reason, failing commands.
fn parts(verdict: Option<&Verdict>, running: &str) -> (Option<bool>, Option<String>, Vec<String>) {
    match verdict {
        Some(Verdict::Sound) => (Some(true), None, Vec::new()),
        Some(Verdict::Unsound { reason, failing }) => {
            (Some(false), Some(reason.clone()), failing.clone())
        }
        Some(Verdict::Unknown { reason }) => (None, Some(reason.clone()), Vec::new()),
        None => (None, Some(running.to_string()), Vec::new()),
    }
}

/// One runtime's soundness over its engines' start-up probes and the images probed: unsound
/// when one is, sound when all are, else not known. Reasons name the engine when there are
/// several, and the image when it is not the start-up probe's. A start-up probe without an
/// image ("nothing probed yet") and one whose image is also among `images` give way to them.
fn aggregate(startup: &[Probed], images: Vec<ImageSoundness>) -> RuntimeSoundness {
    let mut engines: Vec<&str> = startup
        .iter()
        .map(|p| p.engine.as_str())
        .chain(images.iter().map(|i| i.engine.as_str()))
        .collect();
    engines.sort_unstable();
    engines.dedup();
    let several = engines.len() > 1;
    let named = |engine: &str, image: Option<&str>, reason: &str| {
        let mut at = Vec::new();
        if let Some(image) = image {
            at.push(format!("image {image}"));
        }
        if several {
            at.push(format!("engine {engine}"));
        }
        if at.is_empty() {
            reason.to_string()
        } else {
            format!("{}: {reason}", at.join(" on "))
        }
    };
    // (label, sound, reason, failing) of every verdict that counts.
    let mut all: Vec<(Option<bool>, String, Vec<String>)> = Vec::new();
    for p in startup {
        let covered = match &p.image {
            None => !images.is_empty(),
            Some(image) => images
                .iter()
                .any(|i| i.engine == p.engine && &i.image == image),
        };
        if covered {
            continue;
        }
        let (sound, reason, failing) = parts(p.verdict.as_ref(), "the probe is running");
        all.push((
            sound,
            named(&p.engine, None, reason.as_deref().unwrap_or("")),
            failing,
        ));
    }
    for i in &images {
        all.push((
            i.sound,
            named(&i.engine, Some(&i.image), i.reason.as_deref().unwrap_or("")),
            i.failing.clone(),
        ));
    }
    let mut failing: Vec<String> = Vec::new();
    for (_, _, f) in all.iter().filter(|(s, _, _)| *s == Some(false)) {
        for c in f {
            if !failing.contains(c) {
                failing.push(c.clone());
            }
        }
    }
    let reasons = |want: Option<bool>| {
        let mut r: Vec<String> = all
            .iter()
            .filter(|(s, _, _)| *s == want)
            .map(|(_, r, _)| r.clone())
            .collect();
        r.dedup();
        r
    };
    let (sound, reasons) = if all.iter().any(|(s, _, _)| *s == Some(false)) {
        (Some(false), reasons(Some(false)))
    } else if all.is_empty() || all.iter().any(|(s, _, _)| s.is_none()) {
        (None, reasons(None))
    } else {
        (Some(true), Vec::new())
    };
    let image = startup.iter().find_map(|p| p.image.clone()).or_else(|| {
        images
            .iter()
            .find(|i| i.sound == Some(false))
            .or(images.first())
            .map(|i| i.image.clone())
    });
    RuntimeSoundness {
        sound,
        reason: (!reasons.is_empty()).then(|| reasons.join("; ")),
        failing,
        image,
        images,
    }
}

/// The probes of the images sessions use on one engine, under `runsc`: each image (by id) is
/// probed on its first use, in the background, once however many sessions of it arrive
/// meanwhile; its verdict goes to [`RuntimeHealth`] (health, metrics, log) and to the sessions
/// of that image ([`ImageProbes::warning`]).
pub struct ImageProbes {
    engine: Arc<dyn ContainerEngine>,
    config: Arc<Config>,
    name: String,
    runtime: &'static str,
    health: Arc<RuntimeHealth>,
    /// The background probes, awaited (for a while) at shutdown so that none leaves its
    /// container behind.
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl ImageProbes {
    /// The probes of engine `name`; `None` unless the sandboxes run under `runsc`.
    pub fn new(
        engine: Arc<dyn ContainerEngine>,
        config: Arc<Config>,
        name: &str,
        health: Arc<RuntimeHealth>,
    ) -> Option<Arc<Self>> {
        (config.sessions.runtime == Runtime::Runsc).then(|| {
            Arc::new(Self {
                runtime: config.sessions.runtime.as_str(),
                engine,
                config,
                name: name.to_string(),
                health,
                tasks: Mutex::default(),
            })
        })
    }

    /// Session `session_id` was just made: its image is probed in the background unless its
    /// verdict is known (one inspect of the session, then nothing more for a known image). The
    /// create does not wait.
    pub fn on_session(self: &Arc<Self>, session_id: &str) {
        let this = self.clone();
        let id = session_id.to_string();
        let task = tokio::spawn(async move {
            let info = match tokio::time::timeout(REMOVE_TIMEOUT, this.engine.inspect(&id)).await {
                Ok(Ok(info)) => info,
                Ok(Err(e)) => {
                    tracing::debug!(session_id = %id, error = %e, "runtime probe: session not inspected");
                    return;
                }
                Err(_) => return,
            };
            let Some(image_id) = info.image_id.clone() else {
                return;
            };
            let image = info.label(IMAGE_LABEL).unwrap_or(&image_id).to_string();
            this.verdict_of(&image, &image_id).await;
        });
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }

    /// The verdict on image `image_id` (named `image`): the one known, else one probe's, shared
    /// by every caller waiting meanwhile.
    pub async fn verdict_of(&self, image: &str, image_id: &str) -> Verdict {
        let entry = self
            .health
            .image_entry(self.runtime, &self.name, image, image_id);
        let probed = AtomicBool::new(false);
        let (verdict, _) = entry
            .verdict
            .get_or_init(|| async {
                let v = probe(&*self.engine, &self.config, image_id, PROBE_TIMEOUT).await;
                probed.store(true, Ordering::Relaxed);
                (v, Instant::now())
            })
            .await;
        // Once the verdict is in place: the caller that probed logs it and sets the metrics.
        if probed.load(Ordering::Relaxed) {
            self.health
                .image_probed(self.runtime, &self.name, image, image_id, verdict);
        }
        verdict.clone()
    }

    /// The start-up probe of `image` (a reference): pulled when missing, then probed as the
    /// sessions' images are (a session of it later finds the verdict).
    pub async fn probe_reference(&self, image: &str) -> Verdict {
        let id = match tokio::time::timeout(PROBE_TIMEOUT, self.engine.ensure_image(image)).await {
            Ok(Ok(found)) => found.id,
            Ok(Err(e)) => {
                return Verdict::Unknown {
                    reason: format!("the probe could not run in {image}: {}", e.public()),
                };
            }
            Err(_) => {
                return Verdict::Unknown {
                    reason: format!(
                        "the probe in {image} did not finish within {} s",
                        PROBE_TIMEOUT.as_secs()
                    ),
                };
            }
        };
        self.verdict_of(image, &id).await
    }

    /// The warning for a session of image `image_id`: what fails and the fix, when its image
    /// was found unsound.
    pub fn warning(&self, image_id: &str) -> Option<String> {
        match self.health.image_verdict(&self.name, image_id)? {
            Verdict::Unsound { reason, failing } => Some(format!(
                "commands fail in this session's image under the sandboxes' runtime ({}): {} \
                 fail: {reason}",
                self.runtime,
                failing.join(", ")
            )),
            _ => None,
        }
    }

    /// Whether an image of this engine was found unsound (else no session has a warning).
    pub fn any_unsound(&self) -> bool {
        self.health.any_unsound(&self.name)
    }

    /// Waits up to `within` for the probes still running (each removes its container).
    pub async fn shutdown(&self, within: Duration) {
        let tasks: Vec<JoinHandle<()>> = self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        let _ = tokio::time::timeout(within, futures::future::join_all(tasks)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::{self, Source};
    use crate::engine::fake::{FakeEngine, FakeExec};

    struct Env(Vec<(&'static str, &'static str)>);
    impl Source for Env {
        fn get(&self, key: &str) -> Option<String> {
            self.0
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.to_string())
        }
    }

    fn runsc_config(extra: &[(&'static str, &'static str)]) -> Config {
        let mut env = vec![("API_KEY", "k"), ("RUNTIME", "runsc")];
        env.extend_from_slice(extra);
        config::load(&Env(env)).expect("config")
    }

    /// A fake whose probe script answers as coreutils 9.1 does on runsc release-20221219.
    fn statx_einval() -> FakeEngine {
        FakeEngine::new(|cmd| FakeExec {
            chunks: if cmd.contains("check ls ls /") {
                vec![
                    b"ls\t2\tls: cannot access '/': Invalid argument\n".to_vec(),
                    b"stat\t1\tstat: cannot statx '/': Invalid argument\n".to_vec(),
                ]
            } else {
                Vec::new()
            },
            exit_code: 0,
        })
    }

    #[test]
    fn einval_names_the_cause_and_the_release_that_fixes_it() {
        let v = judge(
            "ls\t2\tls: cannot access '/': Invalid argument\nstat\t1\tstat: cannot statx '/': Invalid argument\n",
        );
        let Verdict::Unsound { reason, failing } = v else {
            panic!("{v:?}")
        };
        assert_eq!(failing, ["ls", "stat"]);
        assert!(
            reason.starts_with("gVisor's statx returns EINVAL"),
            "{reason}"
        );
        assert!(reason.contains("release-20230227.0"), "{reason}");
    }

    #[test]
    fn a_sandbox_that_dies_after_a_failed_check_is_unsound_not_unknown() {
        let out = "ls\t2\tls: cannot access '/': Invalid argument\nwaiting on pid 3: urpc method \"containerManager.WaitPID\" failed: EOF\n";
        assert!(any_failed(out));
        let Verdict::Unsound { reason, failing } = judge(out) else {
            panic!("{:?}", judge(out))
        };
        assert_eq!(failing, ["ls", "stat"]);
        assert!(
            reason.starts_with("gVisor's statx returns EINVAL"),
            "{reason}"
        );
        assert!(!any_failed("ls\t0\t\n"));
    }

    #[test]
    fn passing_checks_are_sound_and_other_failures_are_not_blamed_on_statx() {
        assert_eq!(judge("ls\t0\t\nstat\t0\t\n"), Verdict::Sound);
        let Verdict::Unsound { reason, failing } =
            judge("ls\t0\t\nstat\t127\tsh: stat: not found\n")
        else {
            panic!()
        };
        assert_eq!(failing, ["stat"]);
        assert!(!reason.contains("statx"), "{reason}");
        assert!(reason.contains("not found"), "{reason}");
        // No result for a check (no shell, a cut stream): not known, never "sound".
        assert!(matches!(judge("ls\t0\t\n"), Verdict::Unknown { .. }));
        assert!(matches!(judge(""), Verdict::Unknown { .. }));
    }

    #[tokio::test]
    async fn the_probe_runs_as_the_sandbox_user_under_runsc_and_leaves_no_container() {
        let engine = statx_einval();
        let config = runsc_config(&[("RUNTIME_PROBE_IMAGE", "debian-like:12")]);
        let image = probe_image(&config).expect("image");
        let v = probe(&engine, &config, &image, PROBE_TIMEOUT).await;
        assert!(
            matches!(&v, Verdict::Unsound { failing, .. } if failing == &["ls", "stat"]),
            "{v:?}"
        );
        assert!(engine.container_ids().is_empty(), "probe container left");
        let calls = engine.calls();
        let create = calls
            .iter()
            .find(|c| c.starts_with("create "))
            .expect("create");
        assert_eq!(create, "create debian-like:12");
        assert!(calls.iter().any(|c| c.starts_with("remove ")), "{calls:?}");
        // The spec: the runtime, the sandbox user, no capability, no network.
        let spec_seen = Arc::new(Mutex::new(None));
        let engine = FakeEngine::default();
        let hold = engine.hold("exec ");
        let seen = spec_seen.clone();
        let e2 = engine.clone();
        let task = tokio::spawn(async move {
            let config = runsc_config(&[("RUNTIME_PROBE_IMAGE", "img:1")]);
            probe(&e2, &config, "img:1", PROBE_TIMEOUT).await
        });
        let id = loop {
            if let Some(id) = engine.container_ids().first().cloned() {
                break id;
            }
            tokio::task::yield_now().await;
        };
        *seen.lock().expect("lock") = engine.spec(&id);
        drop(hold);
        let _ = task.await;
        let spec = spec_seen.lock().expect("lock").clone().expect("spec");
        assert_eq!(spec.runtime, "runsc");
        assert_eq!(spec.user.as_deref(), Some("1000:1000"));
        assert!(spec.cap_add.is_empty());
        assert_eq!(spec.network, NetworkAttach::None);
        assert_eq!(
            spec.labels.get(ROLE_LABEL).map(String::as_str),
            Some(ROLE_RUNTIME_PROBE)
        );
        assert!(engine.container_ids().is_empty());
    }

    #[tokio::test]
    async fn a_failing_or_slow_engine_is_not_known_and_the_container_still_goes() {
        let config = runsc_config(&[]);
        // Started, then the exec fails.
        let engine = statx_einval();
        engine.fail_on("exec ");
        let v = probe(&engine, &config, "img:1", PROBE_TIMEOUT).await;
        assert!(matches!(v, Verdict::Unknown { .. }), "{v:?}");
        assert!(engine.container_ids().is_empty(), "left after a failure");
        // The exec never answers: the time-out ends it, the container goes anyway.
        let engine = statx_einval();
        let _hold = engine.hold("exec ");
        let v = probe(&engine, &config, "img:1", Duration::from_millis(50)).await;
        let Verdict::Unknown { reason } = v else {
            panic!("{v:?}")
        };
        assert!(reason.contains("did not finish"), "{reason}");
        assert!(engine.container_ids().is_empty(), "left after a time-out");
    }

    #[tokio::test]
    async fn the_image_comes_from_the_setting_else_the_warm_pool() {
        assert_eq!(probe_image(&runsc_config(&[])), None);
        assert_eq!(
            probe_image(&runsc_config(&[("WARM_POOL", "pooled:1=1")])).as_deref(),
            Some("pooled:1")
        );
        assert_eq!(
            probe_image(&runsc_config(&[
                ("WARM_POOL", "pooled:1=1"),
                ("RUNTIME_PROBE_IMAGE", "chosen:2")
            ]))
            .as_deref(),
            Some("chosen:2")
        );
    }

    #[test]
    fn health_and_metric_follow_the_verdicts() {
        let metrics = Metrics::default();
        let health = RuntimeHealth::new(&metrics);
        assert!(health.report().is_empty(), "nothing probed, nothing said");
        health.expect("runsc", "local", Some("img"));
        let r = &health.report()["runsc"];
        assert_eq!(r.sound, None);
        assert!(!metrics.render(None).contains("daiv_sandbox_runtime_sound{"));
        health.record(
            "runsc",
            "local",
            Some("img"),
            judge("ls\t2\tls: cannot access '/': Invalid argument\nstat\t0\t\n"),
        );
        let r = &health.report()["runsc"];
        assert_eq!(r.sound, Some(false));
        assert_eq!(r.failing, ["ls"]);
        assert!(r.reason.as_deref().expect("reason").contains("EINVAL"));
        assert!(
            metrics
                .render(None)
                .contains("daiv_sandbox_runtime_sound{runtime=\"runsc\"} 0"),
            "{}",
            metrics.render(None)
        );
        // Two engines: one sound does not hide the other.
        health.record("runsc", "other", Some("img"), Verdict::Sound);
        let r = &health.report()["runsc"];
        assert_eq!(r.sound, Some(false));
        assert!(
            r.reason
                .as_deref()
                .expect("reason")
                .starts_with("engine local: ")
        );
        health.record("runsc", "local", Some("img"), Verdict::Sound);
        assert_eq!(health.report()["runsc"].sound, Some(true));
        assert!(
            metrics
                .render(None)
                .contains("daiv_sandbox_runtime_sound{runtime=\"runsc\"} 1")
        );
    }

    #[tokio::test]
    async fn an_engine_without_the_runtime_is_unsound_and_output_not_understood_is_unknown() {
        let runc_only = ["runc".to_string()];
        let Some(Verdict::Unsound { reason, .. }) = lacks_runtime(&runc_only, "runsc") else {
            panic!()
        };
        assert!(reason.contains("no runsc runtime"), "{reason}");
        assert_eq!(
            lacks_runtime(&["runc".into(), "runsc".into()], "runsc"),
            None
        );
        // The default responder prints no check results: not known, and nothing left.
        let engine = FakeEngine::default();
        let v = probe(&engine, &runsc_config(&[]), "img:1", PROBE_TIMEOUT).await;
        assert!(matches!(v, Verdict::Unknown { .. }), "{v:?}");
        assert!(engine.container_ids().is_empty());
    }

    /// The probes of a fake engine under `runsc`, with the health and metrics they report to.
    fn image_probes(engine: &FakeEngine) -> (Arc<ImageProbes>, Arc<RuntimeHealth>, Metrics) {
        let metrics = Metrics::default();
        let health = Arc::new(RuntimeHealth::new(&metrics));
        let probes = ImageProbes::new(
            Arc::new(engine.clone()),
            Arc::new(runsc_config(&[])),
            "default",
            health.clone(),
        )
        .expect("probes under runsc");
        (probes, health, metrics)
    }

    fn probes_of(engine: &FakeEngine, image_id: &str) -> usize {
        let want = format!("create {image_id}");
        engine.calls().iter().filter(|c| **c == want).count()
    }

    #[test]
    fn no_image_probes_under_runc() {
        let config = config::load(&Env(vec![("API_KEY", "k")])).expect("config");
        let metrics = Metrics::default();
        let health = Arc::new(RuntimeHealth::new(&metrics));
        let engine = Arc::new(FakeEngine::default());
        assert!(ImageProbes::new(engine, Arc::new(config), "default", health).is_none());
    }

    #[tokio::test]
    async fn an_image_is_probed_once_by_id_even_by_concurrent_sessions_and_again_when_retagged() {
        let engine = statx_einval();
        let (probes, health, metrics) = image_probes(&engine);
        // Two sessions of the image arrive while its probe is in flight: one probe answers both.
        let hold = engine.hold("exec ");
        let (a, b) = (probes.clone(), probes.clone());
        let first = tokio::spawn(async move { a.verdict_of("debian:12", "sha256:d1").await });
        let second = tokio::spawn(async move { b.verdict_of("debian:12", "sha256:d1").await });
        while probes_of(&engine, "sha256:d1") == 0 {
            tokio::task::yield_now().await;
        }
        // Meanwhile the health says it is running, not sound.
        let r = &health.report()["runsc"];
        assert_eq!(r.sound, None, "{r:?}");
        assert_eq!(r.images.len(), 1);
        assert_eq!(r.images[0].sound, None);
        drop(hold);
        let (first, second) = (first.await.expect("task"), second.await.expect("task"));
        assert!(matches!(&first, Verdict::Unsound { .. }), "{first:?}");
        assert_eq!(first, second);
        assert_eq!(probes_of(&engine, "sha256:d1"), 1, "{:?}", engine.calls());
        // Known: the next session probes nothing.
        probes.verdict_of("debian:12", "sha256:d1").await;
        assert_eq!(probes_of(&engine, "sha256:d1"), 1);
        // The tag moved to another image: that one is probed.
        probes.verdict_of("debian:12", "sha256:d2").await;
        assert_eq!(probes_of(&engine, "sha256:d2"), 1);
        assert!(engine.container_ids().is_empty(), "probe containers left");

        // What the operator sees: the runtime unsound, each image with its verdict.
        let r = &health.report()["runsc"];
        assert_eq!(r.sound, Some(false));
        assert_eq!(r.failing, ["ls", "stat"]);
        assert_eq!(r.image.as_deref(), Some("debian:12"));
        let reason = r.reason.as_deref().expect("reason");
        assert!(
            reason.starts_with("image debian:12: gVisor's statx"),
            "{reason}"
        );
        let ids: Vec<&str> = r.images.iter().map(|i| i.image_id.as_str()).collect();
        assert_eq!(ids, ["sha256:d1", "sha256:d2"]);
        for i in &r.images {
            assert_eq!(
                (i.image.as_str(), i.engine.as_str()),
                ("debian:12", "default")
            );
            assert_eq!(i.sound, Some(false));
            assert_eq!(i.failing, ["ls", "stat"]);
        }
        let page = metrics.render(None);
        assert!(
            page.contains("daiv_sandbox_runtime_sound{runtime=\"runsc\"} 0"),
            "{page}"
        );
        assert!(
            page.contains(
                "daiv_sandbox_runtime_probed_images{runtime=\"runsc\",verdict=\"unsound\"} 2"
            ),
            "{page}"
        );
        // What a client sees: the warning of a session of that image, naming the fix.
        let w = probes.warning("sha256:d1").expect("a warning");
        assert!(
            w.contains("ls, stat fail") && w.contains(RUNSC_FIXED_RELEASE),
            "{w}"
        );
        assert!(probes.any_unsound());
        assert_eq!(probes.warning("sha256:other"), None);
    }

    #[tokio::test]
    async fn a_new_session_has_its_image_probed_in_the_background() {
        let engine = statx_einval();
        let (probes, health, _) = image_probes(&engine);
        let spec = ContainerSpec {
            labels: [(IMAGE_LABEL.to_string(), "debian:12".to_string())].into(),
            ..probe_spec(&runsc_config(&[]), "session", "debian:12", "1000:1000")
        };
        let id = engine.create(&spec).await.expect("create");
        let image_id = engine
            .inspect(&id)
            .await
            .expect("inspect")
            .image_id
            .expect("id");
        probes.on_session(&id);
        probes.on_session(&id);
        probes.shutdown(PROBE_TIMEOUT).await;
        assert_eq!(probes_of(&engine, &image_id), 1, "{:?}", engine.calls());
        let r = &health.report()["runsc"];
        assert_eq!(r.images.len(), 1);
        assert_eq!(r.images[0].image, "debian:12");
        assert_eq!(r.images[0].image_id, image_id);
        assert!(probes.warning(&image_id).is_some());
    }

    #[tokio::test]
    async fn the_cache_is_bounded_and_forgets_the_least_recently_used() {
        let engine = statx_einval();
        let (probes, health, _) = image_probes(&engine);
        for n in 0..MAX_IMAGES_PER_ENGINE {
            probes.verdict_of("img", &format!("sha256:{n}")).await;
        }
        // The first is used again: the second is now the least recently used.
        probes.verdict_of("img", "sha256:0").await;
        probes.verdict_of("img", "sha256:new").await;
        let r = &health.report()["runsc"];
        assert_eq!(r.images.len(), MAX_IMAGES_PER_ENGINE);
        assert!(r.images.iter().all(|i| i.image_id != "sha256:1"));
        assert!(probes.warning("sha256:0").is_some());
        assert_eq!(probes.warning("sha256:1"), None);
        // Used again, it is probed again.
        probes.verdict_of("img", "sha256:1").await;
        assert_eq!(probes_of(&engine, "sha256:1"), 2);
        assert_eq!(probes_of(&engine, "sha256:0"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn not_known_is_tried_again_after_a_while() {
        let engine = statx_einval();
        let (probes, _, _) = image_probes(&engine);
        engine.fail_on("exec ");
        let v = probes.verdict_of("img", "sha256:x").await;
        assert!(matches!(v, Verdict::Unknown { .. }), "{v:?}");
        probes.verdict_of("img", "sha256:x").await;
        assert_eq!(probes_of(&engine, "sha256:x"), 1, "not straight away");
        engine.heal();
        tokio::time::advance(RETRY_UNKNOWN).await;
        let v = probes.verdict_of("img", "sha256:x").await;
        assert!(matches!(v, Verdict::Unsound { .. }), "{v:?}");
        assert_eq!(probes_of(&engine, "sha256:x"), 2);
    }

    #[tokio::test]
    async fn the_start_up_probe_and_sessions_share_one_verdict() {
        let engine = statx_einval();
        let (probes, health, _) = image_probes(&engine);
        engine.set_image_id("debian:12", "sha256:d1");
        health.expect("runsc", "default", Some("debian:12"));
        let v = probes.probe_reference("debian:12").await;
        health.record("runsc", "default", Some("debian:12"), v);
        probes.verdict_of("debian:12", "sha256:d1").await;
        assert_eq!(probes_of(&engine, "sha256:d1"), 1);
        let r = &health.report()["runsc"];
        assert_eq!(r.sound, Some(false));
        // One image, said once.
        assert_eq!(r.images.len(), 1);
        let reason = r.reason.as_deref().expect("reason");
        assert_eq!(
            reason.matches("gVisor's statx returns EINVAL").count(),
            1,
            "{reason}"
        );
    }

    #[test]
    fn nothing_probed_yet_gives_way_to_the_images_probed() {
        let metrics = Metrics::default();
        let health = RuntimeHealth::new(&metrics);
        health.record(
            "runsc",
            "default",
            None,
            Verdict::Unknown {
                reason: "no image probed yet".into(),
            },
        );
        assert_eq!(health.report()["runsc"].sound, None);
        let entry = health.image_entry("runsc", "default", "busybox:1", "sha256:b");
        let _ = entry.verdict.set((Verdict::Sound, Instant::now()));
        health.image_probed("runsc", "default", "busybox:1", "sha256:b", &Verdict::Sound);
        let r = &health.report()["runsc"];
        assert_eq!(r.sound, Some(true), "{r:?}");
        assert_eq!(r.reason, None);
        assert_eq!(r.image.as_deref(), Some("busybox:1"));
        assert!(
            metrics
                .render(None)
                .contains("daiv_sandbox_runtime_sound{runtime=\"runsc\"} 1")
        );
    }
}
