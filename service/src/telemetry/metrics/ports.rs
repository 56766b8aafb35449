//! Ingress: connections to ports inside sessions (`ops::ports`).

use prometheus_client::registry::Registry;

use super::{Counter, Gauge, add};

pub struct PortMetrics {
    pub opened: Counter,
    /// Refused: nothing listened, or the session's limit of connections was reached.
    pub refused: Counter,
    pub open: Gauge,
    /// Bytes from clients to the sandboxes' ports.
    pub bytes_in: Counter,
    /// Bytes from the sandboxes' ports to clients.
    pub bytes_out: Counter,
}

impl PortMetrics {
    pub(super) fn new(r: &mut Registry) -> Self {
        Self {
            opened: add(
                r,
                "port_streams_opened",
                "Connections opened to ports inside sessions (ingress)",
                Counter::default(),
            ),
            refused: add(
                r,
                "port_streams_refused",
                "Connections to ports inside sessions refused (nothing listened, or the session's limit)",
                Counter::default(),
            ),
            open: add(
                r,
                "port_streams_open",
                "Connections to ports inside sessions open now",
                Gauge::default(),
            ),
            bytes_in: add(
                r,
                "port_bytes_in",
                "Bytes sent by clients to ports inside sessions",
                Counter::default(),
            ),
            bytes_out: add(
                r,
                "port_bytes_out",
                "Bytes sent by ports inside sessions to clients",
                Counter::default(),
            ),
        }
    }
}
