//! `connect` (protocol 7): a TCP connection to a loopback port of the sandbox, relayed over the
//! channel for ingress. Two threads: this request's own writes what the client sends to the
//! socket (and grants the client more as it does), a reader thread sends what the socket gives,
//! never more than the client granted. Neither side buffers more than it granted, so a slow
//! reader at either end slows its own connection and nothing else on the channel.

use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use sandbox_protocol::frame::{RELAY_CHUNK, kind, window_payload};
use sandbox_protocol::message::{ErrorKind, Event, Response};

use super::{Live, Server, lock};
use crate::ops::{Halt, Input, Stop};

/// What the helper grants the client at first: bytes of DATA it queues for the socket.
pub(super) const WINDOW: u32 = 1024 * 1024;
/// How long a connect to a loopback port may take (a listener with a full backlog).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The client's grants: bytes of DATA the reader thread may still send.
#[derive(Default)]
pub(super) struct Credit {
    state: Mutex<(u64, bool)>,
    cv: Condvar,
    /// DATA bytes received from the client and not yet written to the socket.
    pub(super) queued: AtomicU64,
}

impl Credit {
    pub(super) fn grant(&self, bytes: u32) {
        let mut s = lock(&self.state);
        s.0 += u64::from(bytes);
        self.cv.notify_all();
    }

    fn close(&self) {
        lock(&self.state).1 = true;
        self.cv.notify_all();
    }

    /// Waits for a grant; `None` once closed.
    fn wait(&self) -> Option<u64> {
        let mut s = lock(&self.state);
        loop {
            if s.1 {
                return None;
            }
            if s.0 > 0 {
                return Some(s.0);
            }
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn spend(&self, bytes: usize) {
        let mut s = lock(&self.state);
        s.0 = s.0.saturating_sub(bytes as u64);
    }
}

/// Runs a `connect` to its end.
pub(super) fn connect(
    id: u32,
    port: u16,
    window: u32,
    mut input: Input,
    server: &Server,
    live: &Live,
) -> Response {
    let Some(credit) = live.credit.clone() else {
        return Response::error(ErrorKind::Internal, "a connect without its window");
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let stream = match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
        Ok(s) => s,
        Err(e) if e.kind() == IoKind::ConnectionRefused => {
            return Response::error(
                ErrorKind::Refused,
                format!("nothing listens on port {port} in the sandbox"),
            );
        }
        Err(e) => {
            return Response::error(ErrorKind::Io, format!("connecting to port {port}: {e}"));
        }
    };
    let _ = stream.set_nodelay(true);
    let Ok(from_socket) = stream.try_clone() else {
        return Response::error(ErrorKind::Io, "cannot share the connection");
    };
    credit.grant(window);
    let out = server.out.clone();
    out.event(id, &Event::Connected { window: WINDOW });

    let read_done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (credit, out, done) = (credit.clone(), out.clone(), read_done.clone());
        std::thread::Builder::new()
            .name(format!("relay-{id}"))
            .spawn(move || {
                read_side(id, from_socket, &credit, &out);
                done.store(true, Ordering::SeqCst);
            })
    };
    let Ok(reader) = reader else {
        let _ = stream.shutdown(Shutdown::Both);
        return Response::error(ErrorKind::Internal, "cannot start the relay's reader");
    };

    let stop = Stop {
        cancelled: &live.cancelled,
        deadline: None,
    };
    let outcome = write_side(id, &stream, &mut input, &stop, &credit, server);
    // The read side ends on its own (the server closed its end) unless the request stops.
    let outcome = outcome.and_then(|()| {
        while !read_done.load(Ordering::SeqCst) {
            stop.check().map_err(Ended::Halt)?;
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    });
    let _ = stream.shutdown(Shutdown::Both);
    credit.close();
    let _ = reader.join();
    match outcome {
        Ok(()) => Response::empty(),
        Err(Ended::Halt(Halt::Cancelled)) => match lock(&live.reason).take() {
            Some((kind, why)) => Response::error(kind, why),
            None => Response::error(ErrorKind::Cancelled, "cancelled"),
        },
        Err(Ended::Halt(Halt::Deadline)) => Response::error(ErrorKind::Deadline, "deadline"),
        Err(Ended::Reset(e)) => {
            Response::error(ErrorKind::Io, format!("the connection was reset: {e}"))
        }
    }
}

enum Ended {
    Halt(Halt),
    Reset(std::io::Error),
}

/// The client's DATA to the socket, a WINDOW back for each chunk written; EOF a half close.
fn write_side(
    id: u32,
    mut stream: &TcpStream,
    input: &mut Input,
    stop: &Stop<'_>,
    credit: &Credit,
    server: &Server,
) -> Result<(), Ended> {
    while let Some(chunk) = input.next(stop).map_err(Ended::Halt)? {
        stream.write_all(&chunk).map_err(Ended::Reset)?;
        credit
            .queued
            .fetch_sub(chunk.len() as u64, Ordering::SeqCst);
        let granted = u32::try_from(chunk.len()).unwrap_or(u32::MAX);
        server.out.frame(id, kind::WINDOW, &window_payload(granted));
    }
    let _ = stream.shutdown(Shutdown::Write);
    Ok(())
}

/// The socket's bytes to the client within its grants, then EOF.
fn read_side(id: u32, mut stream: TcpStream, credit: &Credit, out: &super::out::Out) {
    let mut buf = vec![0u8; RELAY_CHUNK];
    while let Some(granted) = credit.wait() {
        let want = usize::try_from(granted)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        match stream.read(&mut buf[..want]) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                credit.spend(n);
                out.frame(id, kind::DATA, &buf[..n]);
            }
        }
    }
    out.frame(id, kind::EOF, &[]);
}
