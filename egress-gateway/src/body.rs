//! Body plumbing: the one response body type, byte counting, and the audit line that is written
//! when a streamed exchange ends (so it can carry the byte count and duration).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};

use crate::audit::{AuditRecord, AuditSink};

/// Every response the gateway sends. Errors are the upstream's, passed through.
pub type Body = UnsyncBoxBody<Bytes, hyper::Error>;

/// An empty body.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// A complete, small body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// An audit record waiting for the end of its exchange. Written exactly once: when finished, or
/// when dropped (client went away mid-body), whichever comes first.
pub struct PendingAudit {
    record: Option<AuditRecord>,
    started: Instant,
    up: Arc<AtomicU64>,
    sink: Arc<dyn AuditSink>,
}

impl PendingAudit {
    /// Holds `record` until the exchange ends; `up` counts bytes sent upstream meanwhile.
    pub fn new(
        record: AuditRecord,
        started: Instant,
        up: Arc<AtomicU64>,
        sink: Arc<dyn AuditSink>,
    ) -> Self {
        Self {
            record: Some(record),
            started,
            up,
            sink,
        }
    }

    fn add_down(&mut self, n: u64) {
        if let Some(r) = self.record.as_mut() {
            r.bytes += n;
        }
    }

    /// Writes the record now.
    pub fn finish(&mut self) {
        if let Some(mut r) = self.record.take() {
            r.bytes_up = self.up.load(Ordering::Relaxed);
            r.duration_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.sink.record(&r);
        }
    }
}

impl Drop for PendingAudit {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A body that counts the bytes of its data frames into a shared counter (request bodies).
pub struct CountingBody<B> {
    inner: B,
    count: Arc<AtomicU64>,
}

impl<B> CountingBody<B> {
    /// Counts `inner`'s bytes into `count`.
    pub fn new(inner: B, count: Arc<AtomicU64>) -> Self {
        Self { inner, count }
    }
}

impl<B: HttpBody<Data = Bytes> + Unpin> HttpBody for CountingBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            self.count.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that streams `inner` frame by frame (no buffering), counts it, and writes
/// the audit line at its end.
pub struct AuditedBody<B> {
    inner: B,
    audit: PendingAudit,
}

impl<B> AuditedBody<B> {
    /// Wraps `inner`; `audit` is written when the body ends or is dropped.
    pub fn new(inner: B, audit: PendingAudit) -> Self {
        Self { inner, audit }
    }
}

impl<B: HttpBody<Data = Bytes> + Unpin> HttpBody for AuditedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    self.audit.add_down(n);
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.audit.finish(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
