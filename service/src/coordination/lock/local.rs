//! In-process locks, used when `REDIS_URL` is unset.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

use super::{LockError, LockGuard, SessionLocks};

type Table = Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>;

/// In-process locks. Entries are dropped when nobody holds or waits for them, so the table does
/// not grow with the number of sessions ever seen.
#[derive(Default)]
pub struct LocalLocks {
    table: Table,
}

struct LocalGuard {
    table: Table,
    key: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Drop for LocalGuard {
    fn drop(&mut self) {
        // Release first, then forget the entry if we were its last user (the table's own Arc
        // plus the guard's mutex Arc are gone: strong count 1 means only the table remains).
        self.guard.take();
        if let Ok(mut table) = self.table.lock()
            && table
                .get(&self.key)
                .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            table.remove(&self.key);
        }
    }
}

#[async_trait::async_trait]
impl SessionLocks for LocalLocks {
    async fn acquire(&self, session_id: &str, wait: Duration) -> Result<LockGuard, LockError> {
        let mutex = {
            let mut table = self
                .table
                .lock()
                .map_err(|_| LockError::Unavailable("lock table poisoned".into()))?;
            table.entry(session_id.to_string()).or_default().clone()
        };
        // `timeout` polls the future once before looking at the clock, so a zero wait still takes
        // a free lock (the reaper relies on that).
        let acquired = tokio::time::timeout(wait, mutex.lock_owned()).await;
        let guard = match acquired {
            Ok(g) => g,
            Err(_) => {
                // Let the entry be collected if we were the only waiter.
                let _ = LocalGuard {
                    table: self.table.clone(),
                    key: session_id.to_string(),
                    guard: None,
                };
                return Err(LockError::Timeout);
            }
        };
        Ok(LockGuard::new(LocalGuard {
            table: self.table.clone(),
            key: session_id.to_string(),
            guard: Some(guard),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn second_holder_waits_then_times_out() -> Result<(), LockError> {
        let locks = LocalLocks::default();
        let held = locks.acquire("s", Duration::from_millis(10)).await?;
        let second = locks.acquire("s", Duration::from_millis(50)).await;
        assert!(matches!(second, Err(LockError::Timeout)));
        // Another session is independent.
        let _other = locks.acquire("t", Duration::from_millis(10)).await?;
        drop(held);
        let _again = locks.acquire("s", Duration::from_millis(10)).await?;
        Ok(())
    }

    #[tokio::test]
    async fn waiter_gets_the_lock_when_released() -> Result<(), LockError> {
        let locks = Arc::new(LocalLocks::default());
        let held = locks.acquire("s", Duration::from_millis(10)).await?;
        let l2 = locks.clone();
        let waiter =
            tokio::spawn(async move { l2.acquire("s", Duration::from_secs(5)).await.is_ok() });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(held);
        assert!(waiter.await.unwrap_or(false));
        Ok(())
    }

    #[tokio::test]
    async fn table_forgets_released_sessions() -> Result<(), LockError> {
        let locks = LocalLocks::default();
        for i in 0..100 {
            let _g = locks
                .acquire(&format!("s{i}"), Duration::from_millis(10))
                .await?;
        }
        let len = locks.table.lock().map(|t| t.len()).unwrap_or(usize::MAX);
        assert_eq!(len, 0);
        Ok(())
    }

    #[tokio::test]
    async fn zero_wait_takes_a_free_lock_and_refuses_a_held_one() -> Result<(), LockError> {
        let locks = LocalLocks::default();
        let held = locks.acquire("s", Duration::ZERO).await?;
        assert!(matches!(
            locks.acquire("s", Duration::ZERO).await,
            Err(LockError::Timeout)
        ));
        drop(held);
        let _again = locks.acquire("s", Duration::ZERO).await?;
        assert!(locks.try_lead("default", Duration::from_secs(1)).await?);
        Ok(())
    }
}
