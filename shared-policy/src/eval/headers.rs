//! The header a policy injects: a name the proxy does not own, a value HTTP can carry.

/// RFC 7230 `token` = 1*tchar.
pub(super) fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Header names the proxy owns: injecting one would break message framing or the destination
/// binding, so a policy may not set them.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
];

/// Whether `value` can be sent as an HTTP header value as written: no control characters
/// (CR, LF and NUL would split the request; the others are refused by HTTP stacks, so a
/// credential holding one would fail every request it is injected into). Tab and any other
/// character are fine. The gateway's header type accepts exactly these (a test there checks it).
pub fn is_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

pub(super) fn check_header_name(name: &str) -> Result<(), &'static str> {
    if !is_token(name) {
        return Err("not an RFC 7230 header name (token)");
    }
    if RESERVED_HEADERS
        .iter()
        .any(|r| r.eq_ignore_ascii_case(name))
    {
        return Err(
            "is a header the proxy manages (framing or destination) and cannot be injected",
        );
    }
    Ok(())
}
