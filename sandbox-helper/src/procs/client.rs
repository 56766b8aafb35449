//! The client: `serve`'s side of background processes. It relays one process request per
//! connection to the supervisor and hands its answer back, never waiting on a supervisor that
//! does not answer for longer than the request itself may wait.

use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use sandbox_protocol::frame::{encode, encode_json, kind, read_frame};
use sandbox_protocol::message::{ErrorKind, ProcRequest, Response};

use super::{MAX_WAIT, STDIN_WAIT, abstract_addr};
use crate::identity::Identity;

/// How long the supervisor may take to answer beyond what the request itself may wait: a
/// stopped or wedged supervisor costs a request this much, never a thread for good.
const ANSWER_GRACE: Duration = Duration::from_secs(10);

/// A connection to the supervisor, with deadlines for the request, and only to a supervisor of
/// the helper's own uid: a command that bound the name first (one can, where the supervisor did
/// not start) must not answer for it.
fn connect(name: &str, identity: &Identity, req: &ProcRequest) -> io::Result<UnixStream> {
    let conn = UnixStream::connect_addr(&abstract_addr(name)?)?;
    let peer = rustix::net::sockopt::socket_peercred(&conn)?;
    if !identity.trusts_peer(peer.uid.as_raw()) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the socket is held by uid {}, not the helper",
                peer.uid.as_raw()
            ),
        ));
    }
    let waits = match req {
        ProcRequest::Poll { wait_ms, .. } | ProcRequest::Events { wait_ms, .. } => {
            Duration::from_millis(*wait_ms).min(MAX_WAIT)
        }
        ProcRequest::Stdin { .. } => STDIN_WAIT,
        _ => Duration::ZERO,
    };
    conn.set_read_timeout(Some(waits + ANSWER_GRACE))?;
    conn.set_write_timeout(Some(ANSWER_GRACE))?;
    Ok(conn)
}

/// One request to the supervisor on socket `name`, as `identity`; returns the DATA frame's
/// bytes (poll output, may be empty) and the response.
pub fn call(
    name: &str,
    identity: &Identity,
    req: &ProcRequest,
    data: Option<&[u8]>,
) -> (Vec<u8>, Response) {
    let unavailable = |e: io::Error| {
        Response::error(
            ErrorKind::Io,
            format!("the session's process supervisor does not answer: {e}"),
        )
    };
    let mut conn = match connect(name, identity, req) {
        Ok(c) => c,
        Err(e) => return (Vec::new(), unavailable(e)),
    };
    let mut msg = Vec::new();
    encode_json(0, kind::REQUEST, req, &mut msg);
    if let Some(d) = data {
        encode(0, kind::DATA, d, &mut msg);
    }
    if let Err(e) = conn.write_all(&msg) {
        return (Vec::new(), unavailable(e));
    }
    let mut output = Vec::new();
    loop {
        match read_frame(&mut conn) {
            Ok(Some(f)) if f.kind == kind::DATA => output = f.payload,
            Ok(Some(f)) if f.kind == kind::RESPONSE => {
                return match serde_json::from_slice(&f.payload) {
                    Ok(r) => (output, r),
                    Err(e) => (
                        Vec::new(),
                        Response::error(ErrorKind::Internal, format!("bad supervisor answer: {e}")),
                    ),
                };
            }
            Ok(Some(_)) => {}
            Ok(None) => {
                return (
                    Vec::new(),
                    unavailable(io::Error::other("it closed the connection")),
                );
            }
            Err(e) => return (Vec::new(), unavailable(io::Error::other(e.to_string()))),
        }
    }
}
