//! In-memory [`ContainerEngine`] for in-process tests of handlers and session logic.
//!
//! Commands are "run" by a scriptable responder; every call is recorded so tests can assert what
//! the control plane asked of the engine. Nothing here claims to test Docker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;

use super::{
    ContainerEngine, ContainerInfo, ContainerSpec, ContainerStatus, EngineError, ExecSpec,
    ExecStream,
};

/// What a fake exec produces: output chunks, then an exit code; `hang` keeps the stream open
/// (a command that never ends) until a kill exec arrives.
#[derive(Clone, Debug, Default)]
pub struct FakeExec {
    pub chunks: Vec<Vec<u8>>,
    pub exit_code: i64,
    pub hang: bool,
}

type Responder = dyn Fn(&str) -> FakeExec + Send + Sync;

#[derive(Default)]
struct State {
    containers: HashMap<String, (ContainerSpec, ContainerStatus)>,
    execs: HashMap<String, i64>,
    calls: Vec<String>,
    next_id: u64,
    engine_down: bool,
    missing_images: Vec<String>,
}

#[derive(Clone)]
pub struct FakeEngine {
    state: Arc<Mutex<State>>,
    responder: Arc<Responder>,
}

impl Default for FakeEngine {
    fn default() -> Self {
        Self::new(|cmd| FakeExec {
            chunks: vec![format!("ran: {cmd}\n").into_bytes()],
            exit_code: 0,
            hang: false,
        })
    }
}

impl FakeEngine {
    /// `responder` receives the user command (the wrapper's `$1`) and says what it "prints".
    pub fn new(responder: impl Fn(&str) -> FakeExec + Send + Sync + 'static) -> Self {
        Self {
            state: Arc::default(),
            responder: Arc::new(responder),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // A poisoned lock means an earlier test panicked; keep going with its state.
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    pub fn calls(&self) -> Vec<String> {
        self.with(|s| s.calls.clone())
    }

    pub fn spec(&self, id: &str) -> Option<ContainerSpec> {
        self.with(|s| s.containers.get(id).map(|(spec, _)| spec.clone()))
    }

    pub fn status(&self, id: &str) -> Option<ContainerStatus> {
        self.with(|s| s.containers.get(id).map(|(_, st)| st.clone()))
    }

    pub fn set_down(&self, down: bool) {
        self.with(|s| s.engine_down = down);
    }

    pub fn set_missing_image(&self, image: &str) {
        self.with(|s| s.missing_images.push(image.to_string()));
    }

    fn check_up(&self, call: String) -> Result<(), EngineError> {
        self.with(|s| {
            s.calls.push(call);
            if s.engine_down {
                Err(EngineError::Unavailable("fake engine is down".into()))
            } else {
                Ok(())
            }
        })
    }
}

#[async_trait::async_trait]
impl ContainerEngine for FakeEngine {
    async fn ping(&self) -> Result<(), EngineError> {
        self.check_up("ping".into())
    }

    async fn ensure_image(&self, image: &str) -> Result<(), EngineError> {
        self.check_up(format!("ensure_image {image}"))?;
        if self.with(|s| s.missing_images.iter().any(|m| m == image)) {
            return Err(EngineError::ImageUnavailable {
                image: image.to_string(),
                reason: "pull access denied".into(),
            });
        }
        Ok(())
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String, EngineError> {
        self.check_up(format!("create {}", spec.image))?;
        Ok(self.with(|s| {
            s.next_id += 1;
            let id = format!("{:064x}", s.next_id);
            s.containers
                .insert(id.clone(), (spec.clone(), ContainerStatus::Created));
            id
        }))
    }

    async fn start(&self, id: &str) -> Result<(), EngineError> {
        self.check_up(format!("start {id}"))?;
        self.with(|s| match s.containers.get_mut(id) {
            Some((_, st)) => {
                *st = ContainerStatus::Running;
                Ok(())
            }
            None => Err(EngineError::NotFound),
        })
    }

    async fn inspect(&self, id: &str) -> Result<ContainerInfo, EngineError> {
        self.check_up(format!("inspect {id}"))?;
        self.with(|s| match s.containers.get(id) {
            Some((spec, st)) => Ok(ContainerInfo {
                id: id.to_string(),
                status: st.clone(),
                labels: spec.labels.clone(),
                finished_at: None,
                memory_bytes: spec.memory_bytes,
                nano_cpus: spec.nano_cpus,
            }),
            None => Err(EngineError::NotFound),
        })
    }

    async fn stop(&self, id: &str, _grace: Duration) -> Result<(), EngineError> {
        self.check_up(format!("stop {id}"))?;
        self.with(|s| match s.containers.get_mut(id) {
            Some((_, st)) => {
                *st = ContainerStatus::Exited;
                Ok(())
            }
            None => Err(EngineError::NotFound),
        })
    }

    async fn remove(&self, id: &str) -> Result<(), EngineError> {
        self.check_up(format!("remove {id}"))?;
        self.with(|s| {
            s.containers
                .remove(id)
                .map(|_| ())
                .ok_or(EngineError::NotFound)
        })
    }

    async fn exec(&self, id: &str, spec: &ExecSpec) -> Result<ExecStream, EngineError> {
        let user_cmd = spec.cmd.last().cloned().unwrap_or_default();
        self.check_up(format!("exec {id} {user_cmd}"))?;
        let is_kill = spec.cmd.get(3).is_some_and(|a| a == "daiv-kill");
        let result = if is_kill {
            FakeExec::default()
        } else {
            (self.responder)(&user_cmd)
        };
        let exec_id = self.with(|s| {
            let exec_id = format!("exec-{}", s.execs.len());
            s.execs.insert(exec_id.clone(), result.exit_code);
            exec_id
        });
        // The wrapper's first line is its pid.
        let mut chunks: Vec<Result<Bytes, EngineError>> = vec![Ok(Bytes::from_static(b"4242\n"))];
        chunks.extend(result.chunks.into_iter().map(|c| Ok(Bytes::from(c))));
        let head = futures::stream::iter(chunks);
        let output = if result.hang {
            head.chain(futures::stream::pending()).boxed()
        } else {
            head.boxed()
        };
        Ok(ExecStream { exec_id, output })
    }

    async fn exec_exit_code(&self, exec_id: &str) -> Result<Option<i64>, EngineError> {
        self.check_up(format!("exec_exit_code {exec_id}"))?;
        Ok(self.with(|s| s.execs.get(exec_id).copied()))
    }

    async fn put_archive(
        &self,
        id: &str,
        path: &str,
        mut tar: BoxStream<'static, Result<Bytes, std::io::Error>>,
    ) -> Result<(), EngineError> {
        self.check_up(format!("put_archive {id} {path}"))?;
        while let Some(chunk) = tar.next().await {
            chunk.map_err(|e| EngineError::Rejected(e.to_string()))?;
        }
        Ok(())
    }

    async fn list(&self, labels: &[(&str, &str)]) -> Result<Vec<ContainerInfo>, EngineError> {
        self.check_up("list".into())?;
        Ok(self.with(|s| {
            s.containers
                .iter()
                .filter(|(_, (spec, _))| {
                    labels
                        .iter()
                        .all(|(k, v)| spec.labels.get(*k).map(String::as_str) == Some(*v))
                })
                .map(|(id, (spec, st))| ContainerInfo {
                    id: id.clone(),
                    status: st.clone(),
                    labels: spec.labels.clone(),
                    finished_at: None,
                    memory_bytes: spec.memory_bytes,
                    nano_cpus: spec.nano_cpus,
                })
                .collect()
        }))
    }
}
