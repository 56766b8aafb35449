//! How the service paces a loop that tries something again until it works or a total wait is
//! spent: a session lock held by another request, a lock release while Redis does not answer,
//! the gateway's exit code lagging its output. One type, so every such loop has a bound that can
//! be read off its construction, and none can wait past it.
//!
//! ```ignore
//! let mut backoff = Backoff::exponential(Duration::from_millis(10), Duration::from_millis(100), wait);
//! loop {
//!     if try_once().await? { break; }
//!     if !backoff.wait().await { return Err(Timeout); }
//! }
//! ```
//!
//! Loops that try again at once (another subnet, another pool member, a fresh helper channel)
//! need no pacing and do not use it.

use std::time::Duration;

use tokio::time::Instant;

/// The pauses between the attempts of one operation, within a total wait. The first pause is
/// `first`, each next one `factor` times the last, at most `max`. The pause that would cross the
/// end of the total is cut short at it, so the caller gets one last attempt at the deadline.
#[derive(Debug, Clone)]
pub struct Backoff {
    pause: Duration,
    max: Duration,
    factor: u32,
    deadline: Instant,
}

impl Backoff {
    /// Pauses doubling from `first` up to `max`, for at most `total`.
    pub fn exponential(first: Duration, max: Duration, total: Duration) -> Self {
        Self::new(first, 2, max, total)
    }

    /// The same pause every time, for at most `total`.
    pub fn fixed(every: Duration, total: Duration) -> Self {
        Self::new(every, 1, every, total)
    }

    fn new(first: Duration, factor: u32, max: Duration, total: Duration) -> Self {
        let now = Instant::now();
        // A total too large for the clock waits "forever" (a century).
        let deadline = now
            .checked_add(total)
            .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
            .unwrap_or(now);
        Self {
            pause: first.min(max),
            max,
            factor,
            deadline,
        }
    }

    /// Waits before the next attempt. `false`, without waiting, once the total wait is spent:
    /// the caller gives up.
    pub async fn wait(&mut self) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        tokio::time::sleep(self.pause.min(self.deadline - now)).await;
        self.pause = self.pause.saturating_mul(self.factor).min(self.max);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pauses `b` takes until it gives up, on tokio's paused clock.
    async fn pauses(mut b: Backoff) -> Vec<u64> {
        let mut out = Vec::new();
        let mut last = Instant::now();
        while b.wait().await {
            let now = Instant::now();
            out.push((now - last).as_millis() as u64);
            last = now;
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn exponential_doubles_to_its_cap_and_stops_at_the_total() {
        let b = Backoff::exponential(
            Duration::from_millis(10),
            Duration::from_millis(100),
            Duration::from_millis(500),
        );
        assert_eq!(pauses(b).await, [10, 20, 40, 80, 100, 100, 100, 50]);
    }

    #[tokio::test(start_paused = true)]
    async fn fixed_repeats_and_a_zero_total_never_waits() {
        let b = Backoff::fixed(Duration::from_millis(20), Duration::from_millis(50));
        assert_eq!(pauses(b).await, [20, 20, 10]);
        let b = Backoff::fixed(Duration::from_secs(1), Duration::ZERO);
        assert!(pauses(b).await.is_empty());
    }
}
