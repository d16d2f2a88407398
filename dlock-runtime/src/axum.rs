//! HTTP answers for lock errors (feature `axum`): a handler guarded by the attribute (or
//! [`with_lock`](crate::with_lock)) returns `Result<T, LockError>`, or an error type of its
//! own that converts through `LockError::into_response`.
//!
//! | error | status | headers |
//! |---|---|---|
//! | [`LockError::Timeout`] | 409 Conflict | `Retry-After`: the holder's remaining lease in whole seconds, rounded up, at least 1 (1 when unknown) |
//! | [`LockError::Lost`], [`LockError::Backend`] | 503 Service Unavailable | |
//! | [`LockError::NotInstalled`], [`LockError::InvalidConfig`], [`LockError::AlreadyInstalled`] | 500 Internal Server Error | |
//!
//! The body is JSON: `{"error": <the error's Display>, "key": <the key, or null>}`. Messages
//! never carry a secret (URLs in them are redacted).

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::error::LockError;

/// `Retry-After` comes from [`LockError::holder_ttl`]: the holder's remaining lease when the
/// acquisition timed out, carried by the error (1 s when unknown).
///
/// ```
/// use axum::http::StatusCode;
/// use axum::response::IntoResponse;
/// use dlock_runtime::LockError;
/// use std::time::Duration;
///
/// let busy = LockError::Timeout {
///     key: "stock:42".into(),
///     waited: Duration::ZERO,
///     holder_ttl: Some(Duration::from_millis(2500)),
/// };
/// let response = busy.into_response();
/// assert_eq!(response.status(), StatusCode::CONFLICT);
/// assert_eq!(response.headers()["retry-after"], "3"); // rounded up
/// ```
impl IntoResponse for LockError {
    fn into_response(self) -> Response {
        let status = status(&self);
        let retry_after = self.is_timeout().then(|| retry_after(self.holder_ttl()));
        let body = serde_json::json!({
            "error": self.to_string(),
            "key": self.key(),
        });
        let mut response = (status, Json(body)).into_response();
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// The status of each error (see the module docs).
fn status(err: &LockError) -> StatusCode {
    match err {
        LockError::Timeout { .. } => StatusCode::CONFLICT,
        LockError::Lost { .. } | LockError::Backend(_) => StatusCode::SERVICE_UNAVAILABLE,
        LockError::NotInstalled | LockError::AlreadyInstalled | LockError::InvalidConfig(_) => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    }
}

/// `Retry-After` in whole seconds: the holder's remaining lease rounded up (retrying sooner
/// would find it still held), at least 1.
fn retry_after(holder_ttl: Option<Duration>) -> u64 {
    holder_ttl
        .map_or(1, |ttl| ttl.as_nanos().div_ceil(1_000_000_000))
        .try_into()
        .unwrap_or(u64::MAX)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Runtime;

    /// Status, `Retry-After` (if any) and JSON body of `err`'s response.
    async fn answer(err: LockError) -> (StatusCode, Option<String>, serde_json::Value) {
        let response = err.into_response();
        let status = response.status();
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        let retry = response
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().expect("ascii").to_owned());
        let bytes = axum::body::to_bytes(response.into_body(), 64 * 1024)
            .await
            .expect("body");
        (status, retry, serde_json::from_slice(&bytes).expect("json"))
    }

    #[tokio::test]
    async fn timeout_is_409_with_retry_after_from_the_holders_ttl() {
        let timeout = LockError::Timeout {
            key: "stock:42".into(),
            waited: Duration::from_millis(250),
            holder_ttl: None,
        };
        let (status, retry, body) = answer(timeout).await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(retry.as_deref(), Some("1"), "the holder's TTL is not known");
        assert_eq!(
            body,
            serde_json::json!({"error": "lock `stock:42` not acquired within 250ms", "key": "stock:42"})
        );
        for (ttl, seconds) in [
            (None, 1),
            (Some(Duration::ZERO), 1),
            (Some(Duration::from_millis(1)), 1),
            (Some(Duration::from_millis(7200)), 8),
            (Some(Duration::from_secs(30)), 30),
            (Some(Duration::from_millis(30_001)), 31),
        ] {
            assert_eq!(retry_after(ttl), seconds, "{ttl:?}");
        }
    }

    #[tokio::test]
    async fn lost_and_backend_are_503_without_retry_after() {
        let (status, retry, body) = answer(LockError::Lost { key: "k".into() }).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry, None);
        assert_eq!(
            body,
            serde_json::json!({"error": "lease of lock `k` was lost while held", "key": "k"})
        );
        let backend = LockError::backend(Some("k2"), "acquire failed", None);
        let (status, retry, body) = answer(backend).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry, None);
        assert_eq!(
            body,
            serde_json::json!({"error": "lock backend error on `k2`: acquire failed", "key": "k2"})
        );
        let (_, _, body) = answer(LockError::backend(None, "down", None)).await;
        assert_eq!(body["key"], serde_json::Value::Null);
    }

    #[tokio::test]
    async fn not_installed_and_invalid_config_are_500_with_a_null_key() {
        let (status, retry, body) = answer(LockError::NotInstalled).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(retry, None);
        assert_eq!(body["key"], serde_json::Value::Null);
        assert!(
            body["error"]
                .as_str()
                .expect("a message")
                .starts_with("no lock runtime installed")
        );
        let (status, _, body) = answer(LockError::config("lock key is empty")).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            body,
            serde_json::json!({"error": "invalid lock configuration: lock key is empty", "key": null})
        );
        let (status, _, _) = answer(LockError::AlreadyInstalled).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[tokio::test]
    async fn a_url_password_never_reaches_the_body() {
        let err = Runtime::from_url("redis://:hunter2@127.0.0.1:1?timeout=forever")
            .await
            .expect_err("bad timeout");
        let (status, _, body) = answer(err).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!body.to_string().contains("hunter2"), "{body}");
    }

    /// A busy lock on the memory engine: the timeout carries what its holder has left.
    #[tokio::test(start_paused = true)]
    async fn a_busy_lock_answers_its_holders_remaining_lease() {
        let rt = Runtime::from_url("memory://").await.expect("memory");
        let _held = rt
            .lock("stock:42")
            .lease(Duration::from_secs(20))
            .watchdog(false)
            .acquire()
            .await
            .expect("acquire");
        tokio::time::advance(Duration::from_millis(4500)).await;
        let err = rt.lock("stock:42").acquire().await.expect_err("busy");
        // A plain value: read outside any runtime, it still carries what it was told.
        drop(rt);
        assert_eq!(err.holder_ttl(), Some(Duration::from_millis(15_500)));
        let (status, retry, _) = answer(err).await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(retry.as_deref(), Some("16"));
    }
}
