//! Text of byte streams: where a chunk may be cut without splitting a UTF-8 character.

/// Length of an incomplete (but so far valid) UTF-8 sequence at the end of `b`, 0..=3: what
/// the decoder reports as an unexpected end (`error_len() == None`), past any invalid bytes
/// before it. Holding these back until the next chunk keeps every chunk's characters whole.
pub fn incomplete_tail(b: &[u8]) -> usize {
    let mut rest = b;
    loop {
        match std::str::from_utf8(rest) {
            Ok(_) => return 0,
            Err(e) => match e.error_len() {
                None => return rest.len() - e.valid_up_to(),
                Some(bad) => rest = &rest[e.valid_up_to() + bad..],
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incomplete_tails_are_measured() {
        assert_eq!(incomplete_tail(b"abc"), 0);
        assert_eq!(incomplete_tail("é".as_bytes()), 0);
        assert_eq!(incomplete_tail(&"é".as_bytes()[..1]), 1);
        assert_eq!(incomplete_tail(&"🦀".as_bytes()[..3]), 3);
        assert_eq!(incomplete_tail(b"\x80\x80\x80"), 0);
        assert_eq!(incomplete_tail(b"\xff\xe2\x82"), 2);
    }
}
