//! Identifiers the service makes or checks: session ids (container ids), tokens naming a
//! session's egress parts or a pool member, and the change detector of spec hashes.

/// A full container id: 64 lowercase hex digits. Names and prefixes are refused, so a request can
/// never address a container by anything but the id the service handed out.
pub fn is_container_id(id: &str) -> bool {
    id.len() == 64
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A fresh random token (16 hex digits): an egress session's parts, a pool member's name.
pub fn random_token() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// FNV-1a (64 bits): a change detector for spec hashes and lock names, not a security property
/// (nothing secret goes through it).
pub fn fnv(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
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
    fn tokens_are_sixteen_hex_digits() {
        let t = random_token();
        assert_eq!(t.len(), 16);
        assert!(t.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(t, random_token());
    }
}
