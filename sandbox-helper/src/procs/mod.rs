//! Background processes: started by one request, outliving it, polled and killed by later ones.
//!
//! They belong to the container, not to a channel: the `init` helper (the container's
//! keep-alive, child of tini) supervises them ([`supervisor`]) and answers on an abstract unix
//! socket, so every `serve` instance (each replica's channel, a channel re-opened after the
//! helper died or the control plane restarted) sees the same processes; `serve` relays the
//! control plane's process requests to it ([`client`]). They die with the container, so a
//! stopped session starts again with none.
//!
//! On the socket, one request per connection, in the protocol's frames
//! ([`sandbox_protocol::frame`]): a REQUEST (a
//! [`ProcRequest`](sandbox_protocol::message::ProcRequest)), for `stdin` one DATA frame; the
//! answer is an optional DATA frame (output of a `poll`) and a RESPONSE. The supervisor and `serve` run under the helper's own uid (see [`crate::identity`])
//! and speak only to each other: each checks the other's uid on the socket. The processes run as
//! the sandbox user.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;
use std::time::Duration;

pub mod autostart;
pub mod client;
pub mod pty;
pub mod supervisor;

/// How long a `stdin` write may wait for a process that does not read.
const STDIN_WAIT: Duration = Duration::from_secs(10);
/// Longest a poll may wait, whatever it asks.
const MAX_WAIT: Duration = Duration::from_secs(300);

fn abstract_addr(name: &str) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(name.as_bytes())
}
