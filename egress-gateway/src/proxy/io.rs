//! The client socket, wrapped: it counts bytes and records when the connection last moved data, so
//! an idle connection (keep-alive, tunnel or MITM session) can be closed and its slot reclaimed.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// When a connection last read or wrote a byte. Shared by the socket wrapper and the tasks that
/// serve the connection (the CONNECT request, then its tunnel or MITM session).
#[derive(Debug)]
pub struct Activity {
    origin: Instant,
    /// Milliseconds since `origin` at the last read or write.
    last_ms: AtomicU64,
}

impl Activity {
    /// Active now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            origin: Instant::now(),
            last_ms: AtomicU64::new(0),
        })
    }

    fn touch(&self) {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(now, Ordering::Relaxed);
    }

    fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.origin.elapsed().saturating_sub(last)
    }

    /// Resolves once no byte has moved for `limit`. Wakes about once per `limit`, not per byte.
    pub async fn idle_for(&self, limit: Duration) {
        loop {
            let idle = self.idle();
            if idle >= limit {
                return;
            }
            tokio::time::sleep(limit - idle).await;
        }
    }
}

/// A stream that counts the bytes read from and written to it, and optionally records activity.
pub struct Metered<T> {
    inner: T,
    activity: Option<Arc<Activity>>,
    /// Bytes read from `inner`.
    pub read: u64,
    /// Bytes written to `inner`.
    pub written: u64,
}

impl<T> Metered<T> {
    /// Wraps `inner`; `activity`, when given, is touched on every read or write that moves data.
    pub fn new(inner: T, activity: Option<Arc<Activity>>) -> Self {
        Self {
            inner,
            activity,
            read: 0,
            written: 0,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    fn moved(&mut self, n: usize) {
        if n > 0
            && let Some(a) = &self.activity
        {
            a.touch();
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Metered<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let n = buf.filled().len() - before;
            self.read += n as u64;
            self.moved(n);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Metered<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            self.written += n as u64;
            self.moved(n);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            self.written += n as u64;
            self.moved(n);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn counts_bytes_and_records_activity() {
        let (a, mut b) = tokio::io::duplex(64);
        let activity = Activity::new();
        let mut a = Metered::new(a, Some(activity.clone()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(activity.idle() >= Duration::from_millis(50));
        a.write_all(b"xyz").await.expect("write");
        assert!(
            activity.idle() < Duration::from_millis(50),
            "a write is activity"
        );
        b.write_all(b"12").await.expect("write");
        let mut two = [0u8; 2];
        a.read_exact(&mut two).await.expect("read");
        assert_eq!((a.read, a.written), (2, 3));
        // Nothing moves: the idle deadline passes (bounded wait).
        tokio::time::timeout(
            Duration::from_secs(10),
            activity.idle_for(Duration::from_millis(20)),
        )
        .await
        .expect("idle_for resolves once idle");
    }
}
