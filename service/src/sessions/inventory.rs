//! What a deployment's sessions are, as the listing and `GET /session/{id}/info/` show them:
//! read from one container listing and one listing of records per engine, never an inspect per
//! session. A claimed warm-pool member's creation time and limits come from its claimed name
//! ([`Claim`]), a cold session's from its container and labels.

use crate::api::{SessionInfo, SessionState};
use crate::engine::{
    CPUS_LABEL, CREATED_MS_LABEL, ContainerInfo, DEPLOYMENT_LABEL, EGRESS_LABEL, IMAGE_LABEL,
    MEMORY_LABEL, ROLE_LABEL, ROLE_SANDBOX, SNAPSHOT_LABEL,
};
use crate::pool::Claim;
use crate::time::rfc3339;

use super::record::Record;
use super::{SessionError, SessionId, Sessions};

/// A listed session and the key it is ordered by.
#[derive(Debug, Clone)]
pub struct Listed {
    /// Unix milliseconds it was created (or claimed).
    pub created_ms: i64,
    pub info: SessionInfo,
}

impl Sessions {
    /// Every session of this deployment on this engine (`engine` names it in the answer).
    pub async fn inventory(&self, engine: &str) -> Result<Vec<Listed>, SessionError> {
        let filter = [
            (ROLE_LABEL, ROLE_SANDBOX),
            (DEPLOYMENT_LABEL, self.config().deployment.as_str()),
        ];
        let (containers, records) = tokio::join!(self.engine().list(&filter), self.records());
        let mut records = records?;
        Ok(containers?
            .iter()
            .filter(|c| is_session(c, &self.config().deployment))
            .map(|c| listed(c, records.remove(&c.id), engine, self.warning_of(c)))
            .collect())
    }

    /// `GET /session/{id}/info/`: the session as the listing shows it.
    pub async fn info(&self, id: &SessionId, engine: &str) -> Result<Listed, SessionError> {
        let (info, record) = tokio::join!(self.find(id), self.record(id));
        let info = info?;
        let warning = self.warning_of(&info);
        Ok(listed(&info, record?, engine, warning))
    }
}

fn is_session(c: &ContainerInfo, deployment: &str) -> bool {
    c.is_managed()
        && c.labels.get(ROLE_LABEL).map(String::as_str) == Some(ROLE_SANDBOX)
        && c.labels.get(DEPLOYMENT_LABEL).map(String::as_str) == Some(deployment)
        && !crate::pool::is_unclaimed(c)
}

/// A listed session's memory and CPU limits (bytes, nano-CPUs): its claim's, else its labels'.
pub(super) fn limits(c: &ContainerInfo) -> (Option<i64>, Option<i64>) {
    let label_i64 = |key: &str| c.label(key).and_then(|v| v.parse::<i64>().ok());
    match Claim::of(c) {
        Some(k) => (k.memory_bytes, k.nano_cpus),
        None => (label_i64(MEMORY_LABEL), label_i64(CPUS_LABEL)),
    }
}

fn listed(
    c: &ContainerInfo,
    record: Option<Record>,
    engine: &str,
    runtime_warning: Option<String>,
) -> Listed {
    let claim = Claim::of(c);
    // Docker's creation time in a listing has whole seconds; the label has the milliseconds
    // that order creates within one second. A claim's name has whole seconds: a claimed name
    // must not depend on the moment, or two replicas racing for one member would both win it.
    let created_ms = claim
        .map(|k| k.at.saturating_mul(1000))
        .filter(|at| *at > 0)
        .or_else(|| c.label(CREATED_MS_LABEL).and_then(|v| v.parse().ok()))
        .or(c.created.map(|s| s.saturating_mul(1000)))
        .unwrap_or(0);
    let (memory_bytes, nano_cpus) = limits(c);
    let state = if c.is_paused() {
        SessionState::Paused
    } else if c.is_running() {
        SessionState::Running
    } else {
        SessionState::Stopped
    };
    let record = record.unwrap_or_default();
    Listed {
        created_ms,
        info: SessionInfo {
            session_id: c.id.clone(),
            base_image: c.label(IMAGE_LABEL).unwrap_or_default().to_string(),
            snapshot_id: c.label(SNAPSHOT_LABEL).map(str::to_string),
            state,
            created_at: rfc3339(created_ms.div_euclid(1000)),
            expires_at: record.deadline.map(rfc3339),
            on_timeout: record.on_timeout,
            cpus: nano_cpus.map(crate::api::cpus_of),
            memory_bytes,
            egress: c.label(EGRESS_LABEL).is_some(),
            metadata: record.metadata,
            engine: engine.to_string(),
            runtime_warning,
        },
    }
}
