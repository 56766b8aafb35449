//! The deployment's sessions: `GET /sessions/` (filtered, paged), `GET /session/{id}/info/`, and
//! `POST /session/{id}/timeout/` (a session's deadline moved), `GET /session/{id}/metrics/`.
//!
//! Pages are ordered by (`created_at`, `session_id`), oldest first unless `order=desc`, and the
//! cursor (`next`) is the last key a page gave, so a walk is stable while sessions come and go:
//! one that lives through the walk is listed exactly once; one made meanwhile sorts after every
//! earlier one (oldest first; newest first, a walk begun before it never reaches it). The cursor is opaque
//! and signed with a key derived from the API key and the deployment, over the filters it was
//! made for: a cursor of another deployment or key, or of other filters, is refused (422).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::hmac;

use super::extract::Id;
use crate::api::{
    Metadata, MetricsQuery, SessionInfo, SessionList, SessionMetrics, SessionState, TimeoutRequest,
};
use crate::config::Config;
use crate::error::{ApiError, ApiJson, ApiQuery, ErrorBody};
use crate::fleet::Fleet;
use crate::ops::{Ops, lifecycle};

/// Sessions a page holds unless `limit` says otherwise, and at most.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

/// List the deployment's sessions, on every engine that answers, oldest first (or newest).
#[utoipa::path(get, path = "/sessions/", tag = "session", operation_id = "list_sessions",
    security(("api_key" = [])),
    params(
        ("state" = Option<SessionState>, Query, description = "Only sessions in this state (repeat for several)"),
        ("metadata" = Option<String>, Query, pattern = r"^[A-Za-z0-9._-]{1,64}=", description = "`key=value`: only sessions whose metadata has it (repeat: all of them)"),
        ("image" = Option<String>, Query, min_length = 1, description = "Only sessions of this base image"),
        ("created_after" = Option<i64>, Query, description = "Only sessions created (or claimed) at or after this Unix second"),
        ("order" = Option<String>, Query, pattern = "^(asc|desc)$", description = "`asc` (oldest first, the default) or `desc`"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "Sessions per page (100)"),
        ("next" = Option<String>, Query, description = "The `next` of the previous page")),
    responses((status = 200, body = SessionList), (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody, description = "An unknown parameter, a bad value or a cursor not of this listing"),
        (status = 503, body = ErrorBody)))]
pub async fn list(
    State(fleet): State<Arc<Fleet>>,
    ApiQuery(pairs): ApiQuery<Vec<(String, String)>>,
) -> Result<Json<SessionList>, ApiError> {
    let query = ListQuery::parse(&pairs)?;
    let cursor = CursorKey::new(fleet.config());
    let after = match &query.next {
        Some(token) => Some(cursor.open(token, &query.filters_text())?),
        None => None,
    };
    let mut all: Vec<(i64, SessionInfo)> = fleet
        .inventory()
        .await?
        .into_iter()
        .map(|l| (l.created, l.info))
        .filter(|(created, s)| query.admits(*created, s))
        .collect();
    if let Some((ac, aid)) = &after {
        let past = |(created, s): &(i64, SessionInfo)| {
            let order = (*created, s.session_id.as_str()).cmp(&(*ac, aid.as_str()));
            order
                == if query.desc {
                    Ordering::Less
                } else {
                    Ordering::Greater
                }
        };
        all.retain(past);
    }
    all.sort_by(|a, b| (a.0, &a.1.session_id).cmp(&(b.0, &b.1.session_id)));
    if query.desc {
        all.reverse();
    }
    let more = all.len() > query.limit;
    all.truncate(query.limit);
    let next = match all.last() {
        Some((created, s)) if more => {
            Some(cursor.seal(*created, &s.session_id, &query.filters_text()))
        }
        _ => None,
    };
    Ok(Json(SessionList {
        sessions: all.into_iter().map(|(_, s)| s).collect(),
        next,
    }))
}

/// One session as the listing shows it (`GET /session/{id}/` stays the reference's bare 204).
#[utoipa::path(get, path = "/session/{session_id}/info/", tag = "session",
    operation_id = "session_info", security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 200, body = SessionInfo), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn info(
    State(fleet): State<Arc<Fleet>>,
    Id(id): Id,
) -> Result<Json<SessionInfo>, ApiError> {
    let cell = fleet.cell_of(&id)?;
    Ok(Json(cell.sessions().info(&id, &cell.name()).await?.info))
}

/// Move the session's deadline to now plus `timeout_seconds` (shorter or longer); a session
/// without one gets one (`on_timeout` as its create said, else `remove`).
#[utoipa::path(post, path = "/session/{session_id}/timeout/", tag = "session",
    operation_id = "set_session_timeout", request_body = TimeoutRequest,
    security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 200, body = SessionInfo, description = "The session with its new deadline"),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn timeout(
    State(ops): State<Ops>,
    Id(id): Id,
    ApiJson(req): ApiJson<TimeoutRequest>,
) -> Result<Json<SessionInfo>, ApiError> {
    let op = lifecycle::SetTimeout {
        seconds: req.timeout_seconds,
    };
    Ok(Json(ops.apply(&id, op).await?))
}

/// The session's CPU, memory and disk, sampled every `SESSION_METRICS_INTERVAL_SECONDS` while
/// it runs; the last `SESSION_METRICS_SAMPLES` are kept.
#[utoipa::path(get, path = "/session/{session_id}/metrics/", tag = "session",
    operation_id = "session_metrics", security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id"), MetricsQuery),
    responses((status = 200, body = SessionMetrics), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn metrics(
    State(ops): State<Ops>,
    Id(id): Id,
    ApiQuery(q): ApiQuery<MetricsQuery>,
) -> Result<Json<SessionMetrics>, ApiError> {
    let samples = ops.metrics(&id, q.start, q.end).await?;
    Ok(Json(SessionMetrics { samples }))
}

/// A listing's parameters, checked.
#[derive(Debug, Default)]
struct ListQuery {
    states: Vec<SessionState>,
    metadata: BTreeMap<String, String>,
    image: Option<String>,
    created_after: Option<i64>,
    desc: bool,
    limit: usize,
    next: Option<String>,
}

impl ListQuery {
    fn parse(pairs: &[(String, String)]) -> Result<Self, ApiError> {
        let bad = |m: String| Err(ApiError::Unprocessable(m));
        let mut q = Self {
            limit: DEFAULT_LIMIT,
            ..Self::default()
        };
        for (k, v) in pairs {
            match k.as_str() {
                "state" => match SessionState::parse(v) {
                    Some(s) => q.states.push(s),
                    None => return bad(format!("state: {v:?} is not running, paused or stopped")),
                },
                "metadata" => {
                    let Some((key, value)) = v.split_once('=') else {
                        return bad(format!("metadata: {v:?} is not key=value"));
                    };
                    if !Metadata::valid_key(key) {
                        return bad(format!(
                            "metadata: key {key:?} is not 1 to 64 bytes of [A-Za-z0-9._-]"
                        ));
                    }
                    if q.metadata.get(key).is_some_and(|had| had != value) {
                        return bad(format!("metadata: key {key:?} given two values"));
                    }
                    q.metadata.insert(key.to_string(), value.to_string());
                }
                "image" if !v.is_empty() => q.image = Some(v.clone()),
                "image" => return bad("image: empty".into()),
                "created_after" => match v.parse::<i64>() {
                    Ok(t) => q.created_after = Some(t),
                    Err(_) => return bad(format!("created_after: {v:?} is not a Unix second")),
                },
                "order" => match v.as_str() {
                    "asc" => q.desc = false,
                    "desc" => q.desc = true,
                    _ => return bad(format!("order: {v:?} is not asc or desc")),
                },
                "limit" => match v.parse::<usize>() {
                    Ok(n) if (1..=MAX_LIMIT).contains(&n) => q.limit = n,
                    _ => {
                        return bad(format!(
                            "limit: {v:?} is not a number from 1 to {MAX_LIMIT}"
                        ));
                    }
                },
                "next" => q.next = Some(v.clone()),
                other => {
                    return bad(format!(
                        "unknown parameter {other:?}: the listing takes state, metadata, image, created_after, order, limit and next"
                    ));
                }
            }
        }
        q.states.sort_by_key(|s| *s as u8);
        q.states.dedup();
        Ok(q)
    }

    fn admits(&self, created: i64, s: &SessionInfo) -> bool {
        (self.states.is_empty() || self.states.contains(&s.state))
            && self.created_after.is_none_or(|t| created >= t)
            && self.image.as_ref().is_none_or(|i| *i == s.base_image)
            && self
                .metadata
                .iter()
                .all(|(k, v)| s.metadata.get(k) == Some(v))
    }

    /// The filters, canonical: what a cursor is bound to.
    fn filters_text(&self) -> String {
        serde_json::json!({
            "state": self.states,
            "metadata": self.metadata,
            "image": self.image,
            "created_after": self.created_after,
            "desc": self.desc,
        })
        .to_string()
    }
}

/// Seals and opens the listing's cursors.
struct CursorKey(hmac::Key);

impl CursorKey {
    fn new(config: &Config) -> Self {
        let root = hmac::Key::new(hmac::HMAC_SHA256, config.server.api_key.expose().as_bytes());
        let derived = hmac::sign(
            &root,
            format!("daiv-sandbox session list cursor\n{}", config.deployment).as_bytes(),
        );
        Self(hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref()))
    }

    fn tag(&self, payload: &str, filters: &str) -> hmac::Tag {
        hmac::sign(&self.0, format!("{payload}\n{filters}").as_bytes())
    }

    /// `created.id` (base64) and its tag.
    fn seal(&self, created: i64, id: &str, filters: &str) -> String {
        let payload = format!("{created}.{id}");
        let tag = self.tag(&payload, filters);
        format!("{}.{}", B64.encode(&payload), B64.encode(tag.as_ref()))
    }

    fn open(&self, token: &str, filters: &str) -> Result<(i64, String), ApiError> {
        let refused = || {
            ApiError::Unprocessable(
                "next: not a cursor of this listing (another deployment's, key's or filters')"
                    .into(),
            )
        };
        let (payload, tag) = token.split_once('.').ok_or_else(refused)?;
        let payload = B64.decode(payload).map_err(|_| refused())?;
        let tag = B64.decode(tag).map_err(|_| refused())?;
        let payload = String::from_utf8(payload).map_err(|_| refused())?;
        hmac::verify(&self.0, format!("{payload}\n{filters}").as_bytes(), &tag)
            .map_err(|_| refused())?;
        let (created, id) = payload.split_once('.').ok_or_else(refused)?;
        Ok((created.parse().map_err(|_| refused())?, id.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(q: &[(&str, &str)]) -> Vec<(String, String)> {
        q.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn bad_parameters_are_refused_naming_the_parameter() {
        for (q, named) in [
            (vec![("colour", "red")], "colour"),
            (vec![("state", "gone")], "state"),
            (vec![("metadata", "novalue")], "metadata"),
            (vec![("metadata", "bad key=1")], "metadata"),
            (vec![("limit", "0")], "limit"),
            (vec![("limit", "1001")], "limit"),
            (vec![("limit", "-1")], "limit"),
            (vec![("order", "up")], "order"),
            (vec![("created_after", "yesterday")], "created_after"),
        ] {
            match ListQuery::parse(&pairs(&q)) {
                Err(ApiError::Unprocessable(m)) => assert!(m.contains(named), "{m}"),
                other => panic!("{q:?}: {other:?}"),
            }
        }
        let q = ListQuery::parse(&pairs(&[
            ("state", "running"),
            ("metadata", "a=1"),
            ("metadata", "b=x=y"),
            ("limit", "5"),
        ]))
        .expect("valid");
        assert_eq!(q.limit, 5);
        assert_eq!(q.metadata.get("b").map(String::as_str), Some("x=y"));
    }

    #[test]
    fn cursors_open_only_for_their_key_deployment_and_filters() {
        let a = CursorKey::new(&crate::config::for_tests("key-a", &[("DEPLOYMENT", "one")]));
        let token = a.seal(42, "abc.def", "f");
        assert_eq!(a.open(&token, "f").ok(), Some((42, "abc.def".to_string())));
        assert!(a.open(&token, "g").is_err(), "other filters");
        let other_key =
            CursorKey::new(&crate::config::for_tests("key-b", &[("DEPLOYMENT", "one")]));
        assert!(other_key.open(&token, "f").is_err(), "another key");
        let other_deployment =
            CursorKey::new(&crate::config::for_tests("key-a", &[("DEPLOYMENT", "two")]));
        assert!(
            other_deployment.open(&token, "f").is_err(),
            "another deployment"
        );
        for junk in ["", ".", "x.y", "not-base64!.tag"] {
            assert!(a.open(junk, "f").is_err(), "{junk}");
        }
    }
}
