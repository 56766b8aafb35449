//! The deployment's sessions, listed: filtered and paged (`GET /sessions/`, E2B's list).
//!
//! Pages are ordered by (creation in milliseconds, `session_id`), oldest first unless `order=desc`, and the
//! cursor (`next`) is the last key a page gave, so a walk is stable while sessions come and go:
//! one that lives through the walk is listed exactly once; one made meanwhile sorts after every
//! earlier one (oldest first; newest first, a walk begun before it never reaches it). The cursor is opaque
//! and signed with a key derived from the API key and the deployment, over the filters it was
//! made for: a cursor of another deployment or key, or of other filters, is refused (422).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::hmac;

use super::Ops;
use crate::api::{Metadata, SessionInfo, SessionList, SessionState};
use crate::config::Config;
use crate::error::ApiError;

/// Sessions a page holds unless `limit` says otherwise, and at most.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

impl Ops {
    /// One page of the deployment's sessions, on every engine that answers, as `query` asks.
    pub async fn list(&self, query: &ListQuery) -> Result<SessionList, ApiError> {
        let cursor = CursorKey::new(self.fleet.config());
        let after = match &query.next {
            Some(token) => Some(cursor.open(token, &query.filters_text())?),
            None => None,
        };
        let mut all: Vec<(i64, SessionInfo)> = self
            .fleet
            .inventory()
            .await?
            .into_iter()
            .map(|l| (l.created_ms, l.info))
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
        Ok(SessionList {
            sessions: all.into_iter().map(|(_, s)| s).collect(),
            next,
        })
    }
}

/// A listing's parameters, checked.
#[derive(Debug, Default)]
pub struct ListQuery {
    states: Vec<SessionState>,
    metadata: BTreeMap<String, String>,
    image: Option<String>,
    created_after: Option<i64>,
    desc: bool,
    limit: usize,
    next: Option<String>,
}

impl ListQuery {
    /// The listing's parameters (`state`, `metadata`, `image`, `created_after`, `order`,
    /// `limit`, `next`) from a query's pairs; 422 naming a bad or unknown one.
    pub fn parse(pairs: &[(String, String)]) -> Result<Self, ApiError> {
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
            && self
                .created_after
                .is_none_or(|t| created >= t.saturating_mul(1000))
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
            format!("daiv-sandbox session list cursor ms\n{}", config.deployment).as_bytes(),
        );
        Self(hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref()))
    }

    fn tag(&self, payload: &str, filters: &str) -> hmac::Tag {
        hmac::sign(&self.0, format!("{payload}\n{filters}").as_bytes())
    }

    /// `created_ms.id` (base64) and its tag (keyed apart from the cursors of versions that
    /// ordered by whole seconds, so one of theirs is refused rather than misread).
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
