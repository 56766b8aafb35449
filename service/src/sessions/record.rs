//! A session's record: what a caller attached to a session besides its container (its metadata,
//! its deadline and what the deadline does), kept as the labels of a volume of role
//! [`ROLE_SESSION_RECORD`] so every replica and a restarted control plane see it, with no
//! database. A container's labels cannot change and a warm-pool member's were written before
//! anyone asked, so the record lives beside the container, not on it.
//!
//! Labels cannot change either: a deadline moves by writing a new record and removing the old
//! one; the newest ([`WRITTEN_LABEL`]) is the session's. Writers hold the session's lock. A
//! session without metadata, timeout or `on_timeout: pause` has no record: its create makes no
//! extra Docker call. A force close removes the record; the reaper removes records whose session
//! is gone.

use std::collections::{BTreeMap, HashMap};

use crate::api::{MAX_SESSION_TIMEOUT_SECS, Metadata, OnTimeout, StartSessionRequest};
use crate::engine::{
    DEADLINE_LABEL, DEADLINE_PAUSED_LABEL, DEPLOYMENT_LABEL, EngineError, MANAGED_LABEL,
    METADATA_LABEL, ON_TIMEOUT_LABEL, ROLE_LABEL, ROLE_SESSION_RECORD, SESSION_LABEL,
    TIMEOUT_LABEL, VolumeInfo, VolumeSpec, WRITTEN_LABEL,
};
use crate::time::unix_now;

use super::{SessionError, SessionId, Sessions, ValidationError};

/// What a create or a fork asks to be kept with its sessions, checked.
#[derive(Debug, Clone, Default)]
pub struct Lifetime {
    pub metadata: Option<Metadata>,
    pub timeout_secs: Option<u64>,
    pub on_timeout: Option<OnTimeout>,
}

impl Lifetime {
    pub fn new(
        metadata: Option<Metadata>,
        timeout_secs: Option<u64>,
        on_timeout: Option<OnTimeout>,
    ) -> Result<Self, ValidationError> {
        if let Some(t) = timeout_secs {
            check_timeout(t)?;
        }
        Ok(Self {
            metadata,
            timeout_secs,
            on_timeout,
        })
    }

    pub fn of(req: &StartSessionRequest) -> Result<Self, ValidationError> {
        Self::new(req.metadata.clone(), req.timeout_seconds, req.on_timeout)
    }

    /// Whether there is anything to record (else no record is written).
    fn is_empty(&self) -> bool {
        self.metadata.as_ref().is_none_or(|m| m.is_empty())
            && self.timeout_secs.is_none()
            && self.on_timeout.is_none_or(|o| o == OnTimeout::Remove)
    }
}

/// `timeout_seconds` within 1 to [`MAX_SESSION_TIMEOUT_SECS`].
pub fn check_timeout(secs: u64) -> Result<(), ValidationError> {
    if (1..=MAX_SESSION_TIMEOUT_SECS).contains(&secs) {
        Ok(())
    } else {
        Err(ValidationError::SessionTimeout)
    }
}

/// A session's record, read back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    pub metadata: Metadata,
    /// Unix seconds.
    pub deadline: Option<i64>,
    pub on_timeout: OnTimeout,
    /// The length of the deadline last set, in seconds (what a thaw after the deadline paused
    /// the session arms again).
    pub timeout_secs: Option<u64>,
    /// The deadline paused the session (and was cleared): the next thaw arms a new one.
    pub deadline_paused: bool,
    /// Unix milliseconds it was written.
    pub written_ms: i64,
}

/// The record volume's name: the session and when it was written (a rewrite gets a new name).
fn volume_name(session: &str, written_ms: i64) -> String {
    format!("daiv-session-{session}-{written_ms}")
}

impl Sessions {
    /// Label filters of this deployment's records (of `session`, when given).
    fn record_filter<'a>(&'a self, session: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
        let mut labels = vec![
            (ROLE_LABEL, ROLE_SESSION_RECORD),
            (DEPLOYMENT_LABEL, self.config().deployment.as_str()),
        ];
        if let Some(s) = session {
            labels.push((SESSION_LABEL, s));
        }
        labels
    }

    /// Writes the record of a session just made (`lifetime` as its request gave it).
    pub(super) async fn record_new(
        &self,
        id: &str,
        lifetime: &Lifetime,
    ) -> Result<(), SessionError> {
        if lifetime.is_empty() {
            return Ok(());
        }
        let record = Record {
            metadata: lifetime.metadata.clone().unwrap_or_default(),
            deadline: lifetime
                .timeout_secs
                .map(|t| unix_now().saturating_add(t as i64)),
            on_timeout: lifetime.on_timeout.unwrap_or_default(),
            timeout_secs: lifetime.timeout_secs,
            deadline_paused: false,
            written_ms: 0,
        };
        self.write_record(id, &record).await
    }

    /// Writes `record` as the session's newest, then removes the older ones.
    async fn write_record(&self, id: &str, record: &Record) -> Result<(), SessionError> {
        let older = self.record_volumes(id).await?;
        // Strictly after every older one, whatever the clock did.
        let newest = older.iter().filter_map(written_ms).max().unwrap_or(0);
        let written = crate::time::unix_millis().max(newest + 1);
        let mut labels = HashMap::from([
            (MANAGED_LABEL.to_string(), "true".to_string()),
            (ROLE_LABEL.to_string(), ROLE_SESSION_RECORD.to_string()),
            (
                DEPLOYMENT_LABEL.to_string(),
                self.config().deployment.clone(),
            ),
            (SESSION_LABEL.to_string(), id.to_string()),
            (
                METADATA_LABEL.to_string(),
                serde_json::to_string(&record.metadata).unwrap_or_else(|_| "{}".into()),
            ),
            (
                ON_TIMEOUT_LABEL.to_string(),
                record.on_timeout.as_str().to_string(),
            ),
            (WRITTEN_LABEL.to_string(), written.to_string()),
        ]);
        if let Some(d) = record.deadline {
            labels.insert(DEADLINE_LABEL.to_string(), d.to_string());
        }
        if let Some(t) = record.timeout_secs {
            labels.insert(TIMEOUT_LABEL.to_string(), t.to_string());
        }
        if record.deadline_paused {
            labels.insert(DEADLINE_PAUSED_LABEL.to_string(), "true".to_string());
        }
        self.engine()
            .create_volume(&VolumeSpec {
                name: volume_name(id, written),
                labels,
                driver_opts: HashMap::new(),
            })
            .await?;
        if let Some(d) = record.deadline {
            self.deadlines.arm(id, d);
        }
        for v in older {
            if let Err(e) = self.engine().remove_volume(&v.name).await {
                tracing::debug!(session_id = %id, volume = %v.name, error = %e, "an old session record was not removed");
            }
        }
        Ok(())
    }

    async fn record_volumes(&self, id: &str) -> Result<Vec<VolumeInfo>, EngineError> {
        self.engine()
            .list_volumes(&self.record_filter(Some(id)))
            .await
    }

    /// The session's record, when it has one.
    pub async fn record(&self, id: &str) -> Result<Option<Record>, SessionError> {
        let found = self.record_volumes(id).await?;
        Ok(newest(self, &found).remove(id))
    }

    /// Every record of this deployment on this engine, by session.
    pub async fn records(&self) -> Result<HashMap<String, Record>, SessionError> {
        let found = self
            .engine()
            .list_volumes(&self.record_filter(None))
            .await?;
        Ok(newest(self, &found))
    }

    /// Every record volume of this deployment on this engine, with its session and record
    /// (a session may have an older one a rewrite did not remove).
    pub async fn record_volumes_all(&self) -> Result<Vec<(String, String, Record)>, SessionError> {
        let found = self
            .engine()
            .list_volumes(&self.record_filter(None))
            .await?;
        Ok(found
            .iter()
            .filter_map(|v| {
                let (session, record) = self.parse_record(v)?;
                Some((session, v.name.clone(), record))
            })
            .collect())
    }

    /// The newest record of each session among `all` (as [`Self::record_volumes_all`] lists).
    pub fn newest_of(all: &[(String, String, Record)]) -> HashMap<String, Record> {
        let mut out: HashMap<String, Record> = HashMap::new();
        for (session, _, record) in all {
            match out.get(session) {
                Some(r) if r.written_ms >= record.written_ms => {}
                _ => {
                    out.insert(session.clone(), record.clone());
                }
            }
        }
        out
    }

    /// The session's deadline cleared once it paused the session (a thaw must not find it
    /// past its deadline), and marked so the thaw arms a new one ([`Self::rearm_deadline`]).
    pub async fn clear_deadline(&self, id: &str) -> Result<(), SessionError> {
        let Some(mut record) = self.record(id).await? else {
            return Ok(());
        };
        // A record written before its timeout's length was kept: the deadline it set, counted
        // from when it was written.
        if record.timeout_secs.is_none()
            && let Some(d) = record.deadline
        {
            let ms = d.saturating_mul(1000).saturating_sub(record.written_ms);
            let secs = u64::try_from(ms.saturating_add(999) / 1000).unwrap_or(0);
            record.timeout_secs = Some(secs.clamp(1, MAX_SESSION_TIMEOUT_SECS));
        }
        record.deadline = None;
        record.deadline_paused = true;
        self.write_record(id, &record).await
    }

    /// Before a thaw (the caller holds the lock): a session its deadline paused gets a deadline
    /// again, its last timeout from now, so it cannot run on without one.
    pub(super) async fn rearm_deadline(&self, id: &str) -> Result<(), SessionError> {
        let Some(mut record) = self.record(id).await? else {
            return Ok(());
        };
        if !record.deadline_paused {
            return Ok(());
        }
        record.deadline_paused = false;
        if let Some(t) = record.timeout_secs {
            record.deadline = Some(unix_now().saturating_add(t as i64));
        }
        self.write_record(id, &record).await?;
        tracing::info!(session_id = %id, deadline = ?record.deadline, "a session its deadline paused got a deadline again");
        Ok(())
    }

    /// Removes a record volume (the reaper's, for a session that is gone).
    pub async fn remove_record_volume(&self, name: &str) -> Result<(), SessionError> {
        match self.engine().remove_volume(name).await {
            Ok(()) | Err(EngineError::NotFound) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes every record of the session (a force close).
    pub(super) async fn remove_records(&self, id: &str) {
        let Ok(found) = self.record_volumes(id).await else {
            return;
        };
        for v in found {
            if let Err(e) = self.engine().remove_volume(&v.name).await {
                tracing::warn!(session_id = %id, volume = %v.name, error = %e, "a session record was not removed");
            }
        }
    }

    /// `POST /session/{id}/timeout/` (the caller holds the lock): the deadline becomes now +
    /// `secs`; the metadata and `on_timeout` stay.
    pub async fn set_timeout(&self, id: &SessionId, secs: u64) -> Result<(), SessionError> {
        check_timeout(secs)?;
        self.find(id).await?;
        let mut record = self.record(id).await?.unwrap_or_default();
        record.deadline = Some(unix_now().saturating_add(secs as i64));
        record.timeout_secs = Some(secs);
        record.deadline_paused = false;
        self.write_record(id, &record).await
    }

    /// The session's metadata patched (the caller holds the lock): each key of `patch` set to its
    /// value, or removed for `None`; the rest, the deadline and `on_timeout` stay. The result is
    /// checked as a create's metadata is.
    pub async fn patch_metadata(
        &self,
        id: &SessionId,
        patch: BTreeMap<String, Option<String>>,
    ) -> Result<(), SessionError> {
        self.find(id).await?;
        let mut record = self.record(id).await?.unwrap_or_default();
        let mut merged = std::mem::take(&mut record.metadata).into_inner();
        for (k, v) in patch {
            match v {
                Some(v) => merged.insert(k, v),
                None => merged.remove(&k),
            };
        }
        record.metadata = Metadata::new(merged)
            .map_err(|e| SessionError::from(ValidationError::InvalidMetadata(e)))?;
        self.write_record(id, &record).await
    }

    /// The session and its record, as `volume` says, if it is one of this deployment's.
    fn parse_record(&self, v: &VolumeInfo) -> Option<(String, Record)> {
        let l = &v.labels;
        if l.get(MANAGED_LABEL).map(String::as_str) != Some("true")
            || l.get(ROLE_LABEL).map(String::as_str) != Some(ROLE_SESSION_RECORD)
            || l.get(DEPLOYMENT_LABEL) != Some(&self.config().deployment)
        {
            return None;
        }
        let session = l.get(SESSION_LABEL)?.clone();
        let written = written_ms(v)?;
        if v.name != volume_name(&session, written) {
            return None;
        }
        // Written by us, checked as it was: anything else is not a caller's and is dropped.
        let metadata = l
            .get(METADATA_LABEL)
            .and_then(|m| serde_json::from_str::<BTreeMap<String, String>>(m).ok())
            .and_then(|m| Metadata::new(m).ok())
            .unwrap_or_default();
        Some((
            session,
            Record {
                metadata,
                deadline: l.get(DEADLINE_LABEL).and_then(|d| d.parse().ok()),
                on_timeout: l
                    .get(ON_TIMEOUT_LABEL)
                    .and_then(|o| OnTimeout::parse(o))
                    .unwrap_or_default(),
                timeout_secs: l
                    .get(TIMEOUT_LABEL)
                    .and_then(|t| t.parse::<u64>().ok())
                    .filter(|t| check_timeout(*t).is_ok()),
                deadline_paused: l.get(DEADLINE_PAUSED_LABEL).map(String::as_str) == Some("true"),
                written_ms: written,
            },
        ))
    }
}

fn written_ms(v: &VolumeInfo) -> Option<i64> {
    v.labels.get(WRITTEN_LABEL)?.parse().ok()
}

/// The newest record of each session among `found`.
fn newest(sessions: &Sessions, found: &[VolumeInfo]) -> HashMap<String, Record> {
    let mut out: HashMap<String, Record> = HashMap::new();
    for (session, record) in found.iter().filter_map(|v| sessions.parse_record(v)) {
        match out.get(&session) {
            Some(r) if r.written_ms >= record.written_ms => {}
            _ => {
                out.insert(session, record);
            }
        }
    }
    out
}
