//! The one Redis connection of a deployment with `REDIS_URL`: the session locks, the activity
//! records and the reaper's leadership all go through it, with the same timeouts.
//!
//! Redis trouble fails fast: every call is bounded ([`CALL_TIMEOUT`], plus the connection's own
//! connect and response timeouts), and any error is [`RedisUnavailable`] (which the locks report
//! as a 503), never a hang. The connection is lazy and reconnects by itself, so the service starts
//! while Redis is down and recovers when it returns.

use std::time::Duration;

use redis::aio::ConnectionManager;

use crate::secret::Secret;

/// Upper bound on one Redis call from a request path, whatever the connection does.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// A connection attempt that takes longer means Redis is not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(1500);

/// Redis refused, failed or did not answer in time; the text never carries the URL (it may hold
/// a password).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RedisUnavailable(pub String);

/// A lazily connecting, self-reconnecting Redis connection with bounded timeouts. Creating it
/// never touches the network; clones share it.
pub fn connect(url: &Secret) -> Result<ConnectionManager, RedisUnavailable> {
    let client = redis::Client::open(url.expose())
        // The URL may carry a password: name the setting, not the value.
        .map_err(|e| RedisUnavailable(format!("DAIV_SANDBOX_REDIS_URL: {:?}", e.kind())))?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        // One quick retry: a request must get its 503 in about a second, not after a backoff
        // schedule; the manager reconnects again on the next call.
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_millis(200));
    ConnectionManager::new_lazy_with_config(client, config)
        .map_err(|e| RedisUnavailable(e.to_string()))
}

/// Runs one Redis call with [`CALL_TIMEOUT`]; any failure is [`RedisUnavailable`].
pub async fn bounded<T>(
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, RedisUnavailable> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(RedisUnavailable(format!("Redis: {e}"))),
        Err(_) => Err(RedisUnavailable(format!(
            "Redis did not answer within {CALL_TIMEOUT:?}"
        ))),
    }
}
