//! The start-up probe of the sandboxes' runtime: does what agents run work under it?
//!
//! Under `runsc` (gVisor), the service starts a throwaway container from the probe image (the
//! `RUNTIME_PROBE_IMAGE` setting, else the first warm-pool image), runs `ls /` and `stat /` in it
//! as the sandbox user, and removes it, pass, fail or time-out. What it found is logged (an error
//! when the runtime is not sound), served in `/-/health/` under `runtime` and exported as
//! `daiv_sandbox_runtime_sound{runtime}`. It never stops the service: it tells operators.
//!
//! Why: gVisor before release-20230227.0 answers `statx(2)` with `AT_NO_AUTOMOUNT` (which GNU
//! coreutils 9.1's `ls` and `stat` pass) with EINVAL, so in a Debian 12 image an agent cannot list
//! a directory, while busybox, Python and `find` work (gVisor commit 7a0c4b5, "Ignore
//! AT_NO_AUTOMOUNT flag in statx() calls"; Debian 12's `runsc` package is release-20221219.0).
//!
//! [`judge`] is the decision, pure; [`probe`] runs it through the [`ContainerEngine`] seam;
//! [`RuntimeHealth`] holds the verdicts for the health route and the metric.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt;
use prometheus_client::metrics::family::Family;

use crate::api::RuntimeSoundness;
use crate::config::Config;
use crate::engine::{
    ContainerEngine, ContainerSpec, DEPLOYMENT_LABEL, EngineError, ExecSpec, NetworkAttach,
    ROLE_LABEL,
};
use crate::telemetry::metrics::{Gauge, Metrics, RuntimeLabels};

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
                err.trim().to_string(),
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
    let runtime = config.sessions.runtime.as_str();
    let name = format!("daiv-sandbox-probe-{:016x}", rand::random::<u64>());
    let created: Mutex<Option<String>> = Mutex::new(None);
    let run = async {
        if let Some(missing) = lacks_runtime(&engine.info().await?.runtimes, runtime) {
            return Ok(missing);
        }
        engine.ensure_image(image).await?;
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
        loop {
            // Once a check failed, a sandbox that stops answering has said enough (a runtime
            // that dies under a check can leave the exec hanging).
            let next = if any_failed(&String::from_utf8_lossy(&out)) {
                match tokio::time::timeout(STALLED, stream.output.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                }
            } else {
                stream.output.next().await
            };
            let Some(chunk) = next else { break };
            out.extend_from_slice(&chunk?);
            if out.len() > 64 * 1024 {
                break;
            }
        }
        Ok::<_, EngineError>(judge(&String::from_utf8_lossy(&out)))
    };
    let verdict = match tokio::time::timeout(within, run).await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, image, "runtime probe: engine call failed");
            Verdict::Unknown {
                reason: format!("the probe could not run in {image}: {}", e.public()),
            }
        }
        Err(_) => Verdict::Unknown {
            reason: format!(
                "the probe in {image} did not finish within {} s",
                within.as_secs()
            ),
        },
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
    verdict
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
        log_options: Vec::new(),
        skeleton: Vec::new(),
    }
}

/// The probes' verdicts, per runtime and engine, for `/-/health/` and the metric.
/// One engine's probe of a runtime.
#[derive(Debug, Clone)]
struct Probed {
    engine: String,
    image: Option<String>,
    /// `None` while probing.
    verdict: Option<Verdict>,
}

pub struct RuntimeHealth {
    /// runtime → what each engine's probe found.
    seen: Mutex<BTreeMap<&'static str, Vec<Probed>>>,
    gauge: Family<RuntimeLabels, Gauge>,
}

impl RuntimeHealth {
    pub fn new(metrics: &Metrics) -> Self {
        Self {
            seen: Mutex::default(),
            gauge: metrics.runtime.sound.clone(),
        }
    }

    /// A probe of `runtime` on `engine` has started (or has no image: then `verdict` says so).
    pub fn expect(&self, runtime: &'static str, engine: &str, image: Option<&str>) {
        self.set(runtime, engine, image, None);
    }

    /// Records what a probe found, logs it and sets the metric.
    pub fn record(
        &self,
        runtime: &'static str,
        engine: &str,
        image: Option<&str>,
        verdict: Verdict,
    ) {
        match &verdict {
            Verdict::Sound => {
                tracing::info!(runtime, engine, image, "runtime probe: ls and stat work")
            }
            Verdict::Unsound { reason, failing } => tracing::error!(
                runtime,
                engine,
                image,
                failing = %failing.join(","),
                "runtime probe: the runtime is not sound: {reason}"
            ),
            Verdict::Unknown { reason } => {
                tracing::warn!(runtime, engine, image, "runtime probe: not known: {reason}")
            }
        }
        self.set(runtime, engine, image, Some(verdict));
    }

    fn set(
        &self,
        runtime: &'static str,
        engine: &str,
        image: Option<&str>,
        verdict: Option<Verdict>,
    ) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let list = seen.entry(runtime).or_default();
        list.retain(|p| p.engine != engine);
        list.push(Probed {
            engine: engine.to_string(),
            image: image.map(str::to_string),
            verdict,
        });
        let label = RuntimeLabels { runtime };
        match aggregate(list).sound {
            Some(sound) => {
                self.gauge.get_or_create(&label).set(u64::from(sound));
            }
            None => {
                self.gauge.remove(&label);
            }
        }
    }

    /// The `runtime` field of `/-/health/`.
    pub fn report(&self) -> BTreeMap<String, RuntimeSoundness> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.iter()
            .map(|(runtime, list)| (runtime.to_string(), aggregate(list)))
            .collect()
    }
}

/// One runtime's soundness over its engines: unsound when one is, sound when all are, else
/// not known. Reasons name the engine when there are several.
fn aggregate(list: &[Probed]) -> RuntimeSoundness {
    let named = |engine: &str, reason: &str| {
        if list.len() > 1 {
            format!("engine {engine}: {reason}")
        } else {
            reason.to_string()
        }
    };
    let mut unsound = Vec::new();
    let mut unknown = Vec::new();
    let mut failing: Vec<String> = Vec::new();
    for Probed {
        engine, verdict, ..
    } in list
    {
        match verdict {
            Some(Verdict::Sound) => {}
            Some(Verdict::Unsound { reason, failing: f }) => {
                unsound.push(named(engine, reason));
                for c in f {
                    if !failing.contains(c) {
                        failing.push(c.clone());
                    }
                }
            }
            Some(Verdict::Unknown { reason }) => unknown.push(named(engine, reason)),
            None => unknown.push(named(engine, "the probe is running")),
        }
    }
    let image = list.iter().find_map(|p| p.image.clone());
    let (sound, reasons) = if !unsound.is_empty() {
        (Some(false), unsound)
    } else if !unknown.is_empty() {
        (None, unknown)
    } else {
        (Some(true), Vec::new())
    };
    RuntimeSoundness {
        sound,
        reason: (!reasons.is_empty()).then(|| reasons.join("; ")),
        failing,
        image,
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
}
