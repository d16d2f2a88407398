//! How a failed call or connection attempt becomes a `LockError`.

use std::sync::Arc;
use std::time::Duration;

use redis::RedisError;

use crate::error::LockError;

pub(super) fn redis_error(key: Option<&str>, what: &str, err: RedisError) -> LockError {
    LockError::backend(key, what, Some(Arc::new(err)))
}

/// An I/O "timed out" error as the source of a `Backend` error.
pub(super) fn timed_out(message: String) -> Arc<dyn std::error::Error + Send + Sync> {
    Arc::new(std::io::Error::new(std::io::ErrorKind::TimedOut, message))
}

/// Awaits a connection attempt bounded by `timeout`; a failure is `Backend` saying `what`.
/// Over plaintext (`redis://`), a server that accepted the connection and then dropped it or
/// answered something that is not RESP is most likely a TLS port: the message says so.
pub(super) async fn connect_within<T>(
    timeout: Duration,
    what: &str,
    plaintext: bool,
    connecting: impl std::future::Future<Output = Result<T, RedisError>>,
) -> Result<T, LockError> {
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) if plaintext && looks_like_tls(&e) => Err(redis_error(
            None,
            &format!(
                "{what} (the server dropped a plaintext connection: if it expects TLS, use rediss://)"
            ),
            e,
        )),
        Ok(Err(e)) => Err(redis_error(None, what, e)),
        Err(_) => Err(LockError::backend(
            None,
            what,
            Some(timed_out(format!("no connection within {timeout:?}"))),
        )),
    }
}

/// A connection accepted and then dropped (reset, closed) or answered with bytes that are not
/// RESP: what a TLS server does to a plaintext client.
fn looks_like_tls(e: &RedisError) -> bool {
    (e.is_connection_dropped() && !e.is_connection_refusal()) || e.kind() == redis::ErrorKind::Parse
}
