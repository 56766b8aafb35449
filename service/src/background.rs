//! The one shape of the service's background work (pingora's `BackgroundService`): the
//! reapers' sweeps, the warm pools' refills, the session samples, and a fleet's health checks,
//! pool spread and engines-file watch. Each is a [`Background`]: rounds, each a task of its own
//! (a panic in one is logged under the work's name and the next round still comes), a wait
//! between them, until what it serves is gone or its task is aborted (the owner's shutdown).

use std::future::Future;
use std::ops::ControlFlow;
use std::sync::Arc;

use tokio::task::JoinHandle;

/// A piece of background work, run by [`spawn`].
pub trait Background: Send + Sync + 'static {
    /// The name its log lines carry.
    fn name(&self) -> &'static str;

    /// One round; `Break` once there is nothing left to serve (its owner is gone).
    fn round(self: Arc<Self>) -> impl Future<Output = ControlFlow<()>> + Send;

    /// Until the next round is due.
    fn pause(&self) -> impl Future<Output = ()> + Send;

    /// Whether the first round waits a pause (work that has nothing to do at start-up).
    fn waits_first(&self) -> bool {
        false
    }
}

/// Runs `work`'s rounds until one says it is done or the task is aborted.
pub fn spawn<B: Background>(work: Arc<B>) -> JoinHandle<()> {
    tokio::spawn(async move {
        if work.waits_first() {
            work.pause().await;
        }
        loop {
            match tokio::spawn(work.clone().round()).await {
                Ok(ControlFlow::Break(())) => return,
                Ok(ControlFlow::Continue(())) => {}
                // Its own task: a panic in one round is logged and the next one still comes.
                Err(e) if e.is_panic() => {
                    tracing::error!(work = work.name(), error = %e, "background work: a round crashed")
                }
                Err(_) => return,
            }
            work.pause().await;
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use super::*;

    struct Rounds {
        done: AtomicU32,
        panic_at: u32,
        stop_at: u32,
    }

    impl Background for Rounds {
        fn name(&self) -> &'static str {
            "test"
        }

        async fn round(self: Arc<Self>) -> ControlFlow<()> {
            let n = self.done.fetch_add(1, Ordering::SeqCst) + 1;
            assert!(n != self.panic_at, "round {n} panics");
            if n >= self.stop_at {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }

        async fn pause(&self) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test]
    async fn a_panicking_round_is_followed_by_the_next_and_done_work_ends() {
        let work = Arc::new(Rounds {
            done: AtomicU32::new(0),
            panic_at: 2,
            stop_at: 4,
        });
        tokio::time::timeout(Duration::from_secs(10), spawn(work.clone()))
            .await
            .expect("the work ends")
            .expect("the driver does not panic");
        assert_eq!(work.done.load(Ordering::SeqCst), 4);
    }
}
