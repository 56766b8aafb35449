//! The request middleware's group (`routes::observe`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::registry::Registry;

use super::{Histograms, add, histograms};

/// `http_request_duration_seconds`: the route is the matched template (bounded), never the path;
/// `door` the front door the request came in by (`rest`, `mcp`, `e2b`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub door: String,
    pub method: String,
    pub route: String,
    pub status: u16,
}

pub struct HttpMetrics {
    pub requests: Histograms<HttpLabels>,
}

impl HttpMetrics {
    pub(super) fn new(r: &mut Registry) -> Self {
        Self {
            requests: add(
                r,
                "http_request_duration_seconds",
                "HTTP requests by front door, method, route template and status",
                histograms(),
            ),
        }
    }
}
