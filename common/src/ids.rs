//! Identifiers the service makes or checks: session ids (container ids) and snapshot ids, as
//! the rules and as the types ([`SessionId`], [`SnapshotId`]) they are parsed into once at the
//! edge; tokens naming a session's egress parts or a pool member; the change detector of spec
//! hashes.

/// A full container id: 64 lowercase hex digits. Names and prefixes are refused, so a request can
/// never address a container by anything but the id the service handed out.
pub fn is_container_id(id: &str) -> bool {
    id.len() == 64
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// An engine's name in a fleet (`DAIV_SANDBOX_ENGINES_FILE`): it prefixes the ids of the sessions
/// and snapshots the engine holds, so it is kept to what a URL path, a Docker tag and a Redis key
/// all take without escaping.
pub fn is_engine_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 32
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-')
}

/// The engine an id names and the engine's own id: `b.<id>` is `(Some("b"), <id>)`, an id
/// without a prefix (a session of the default engine) is `(None, id)`. The name is not checked.
pub fn split_engine(id: &str) -> (Option<&str>, &str) {
    match id.split_once('.') {
        Some((engine, rest)) => (Some(engine), rest),
        None => (None, id),
    }
}

/// `raw` as the control plane hands it out for the engine with id prefix `prefix`.
pub fn with_engine(prefix: Option<&str>, raw: &str) -> String {
    match prefix {
        Some(p) => format!("{p}.{raw}"),
        None => raw.to_string(),
    }
}

/// A session id: a full container id, prefixed by its engine's name unless the engine is the
/// default one.
pub fn is_session_id(id: &str) -> bool {
    match split_engine(id) {
        (Some(engine), raw) => is_engine_name(engine) && is_container_id(raw),
        (None, raw) => is_container_id(raw),
    }
}

/// A snapshot id: 32 lowercase hex digits, prefixed by its engine's name (as a session id is)
/// unless the engine is the default one.
pub fn is_snapshot_id(id: &str) -> bool {
    let hex32 = |raw: &str| {
        raw.len() == 32
            && raw
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    match split_engine(id) {
        (Some(engine), raw) => is_engine_name(engine) && hex32(raw),
        (None, raw) => hex32(raw),
    }
}

/// A string that is not the id it was read as (the caller answers 404: an id that cannot exist
/// names nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidId(&'static str);

impl std::fmt::Display for InvalidId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not a valid {} id", self.0)
    }
}

impl std::error::Error for InvalidId {}

/// An id checked once, where it enters the service: `[engine.]raw`, with the rule of
/// [`is_session_id`] or [`is_snapshot_id`]. Everything past the edge takes the type, so nothing
/// checks it again.
macro_rules! checked_id {
    ($(#[$doc:meta])* $name:ident, $what:literal, $rule:path) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// `id` if it follows the rule, else [`InvalidId`].
            pub fn parse(id: &str) -> Result<Self, InvalidId> {
                if $rule(id) {
                    Ok(Self(id.to_string()))
                } else {
                    Err(InvalidId($what))
                }
            }

            /// The engine whose ids carry this prefix (`None`: the default engine).
            pub fn engine(&self) -> Option<&str> {
                split_engine(&self.0).0
            }

            /// The engine's own id, without the prefix.
            pub fn raw(&self) -> &str {
                split_engine(&self.0).1
            }

            /// The id as the API hands it out.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = InvalidId;
            fn from_str(s: &str) -> Result<Self, InvalidId> {
                Self::parse(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidId;
            fn try_from(s: String) -> Result<Self, InvalidId> {
                if $rule(&s) {
                    Ok(Self(s))
                } else {
                    Err(InvalidId($what))
                }
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::try_from(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

checked_id!(
    /// A session id ([`is_session_id`]): what `{session_id}` in a path and a tool's
    /// `session_id` are parsed into once.
    SessionId,
    "session",
    is_session_id
);

checked_id!(
    /// A snapshot id ([`is_snapshot_id`]).
    SnapshotId,
    "snapshot",
    is_snapshot_id
);

/// A fresh random token (16 hex digits): an egress session's parts, a pool member's name.
pub fn random_token() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// FNV-1a (64 bits): a change detector for spec hashes and lock names, not a security property
/// (nothing secret goes through it).
pub fn fnv(bytes: &[u8]) -> u64 {
    fnv_more(FNV_OFFSET, bytes)
}

/// [`fnv`]'s starting state.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// [`fnv`] carried on over more bytes from `hash` (content read in pieces).
pub fn fnv_more(mut hash: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_full_lowercase_container_ids_are_ids() {
        assert!(is_container_id(&"a".repeat(64)));
        assert!(!is_container_id(&"a".repeat(12)));
        assert!(!is_container_id(&"A".repeat(64)));
        assert!(!is_container_id("../../etc"));
    }

    #[test]
    fn session_ids_may_name_their_engine() {
        let raw = "0123456789abcdef".repeat(4);
        assert!(is_session_id(&raw));
        assert!(is_session_id(&format!("b.{raw}")));
        assert!(is_session_id(&format!("eu-west_2.{raw}")));
        assert!(!is_session_id(&format!("B.{raw}")));
        assert!(!is_session_id(&format!(".{raw}")));
        assert!(!is_session_id(&format!("a.b.{raw}")));
        assert!(!is_session_id(&format!("{}.{raw}", "a".repeat(33))));
        assert_eq!(split_engine(&format!("b.{raw}")), (Some("b"), raw.as_str()));
        assert_eq!(with_engine(Some("b"), &raw), format!("b.{raw}"));
        assert_eq!(with_engine(None, &raw), raw);
    }

    #[test]
    fn typed_ids_are_checked_once_and_split() {
        let raw = "0123456789abcdef".repeat(4);
        let id = SessionId::parse(&format!("b.{raw}")).expect("a session id");
        assert_eq!((id.engine(), id.raw()), (Some("b"), raw.as_str()));
        assert_eq!(id.to_string(), format!("b.{raw}"));
        let plain = SessionId::parse(&raw).expect("a session id");
        assert_eq!((plain.engine(), plain.as_str()), (None, raw.as_str()));
        for bad in ["not-an-id", "..", "", &raw[..32]] {
            assert!(SessionId::parse(bad).is_err(), "{bad}");
        }
        let snap = SnapshotId::parse(&format!("b.{}", &raw[..32])).expect("a snapshot id");
        assert_eq!(snap.engine(), Some("b"));
        assert!(SnapshotId::parse(&raw).is_err());
        use serde::Deserialize;
        use serde::de::IntoDeserializer;
        use serde::de::value::{Error, StrDeserializer};
        let read = |s: &str| {
            let d: StrDeserializer<'_, Error> = s.into_deserializer();
            SessionId::deserialize(d)
        };
        assert!(read("x").is_err());
        assert_eq!(read(id.as_str()).ok(), Some(id.clone()));
    }

    #[test]
    fn tokens_are_sixteen_hex_digits() {
        let t = random_token();
        assert_eq!(t.len(), 16);
        assert!(t.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(t, random_token());
    }
}
