//! Lock errors as HTTP answers (feature `axum`), end to end: an axum handler guarded by the
//! attribute, a real holder of its key on a real `redis-server`, one request through the
//! router.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::http::{Request, StatusCode, header};
use axum::routing::post;
use dlock_runtime::{LockError, distributed_lock};
use dlock_tests::{HoldExt, Runtime, lock_key, redis_with_runtime};
use tower::ServiceExt;

#[distributed_lock(key = "stock:{id}")]
async fn reserve(id: u64) -> Result<String, LockError> {
    Ok(format!("reserved {id}"))
}

/// `POST /stock/{id}/reserve`: the lock error is the response as it is.
async fn reserve_handler(Path(id): Path<u64>) -> Result<String, LockError> {
    reserve(id).await
}

fn app() -> Router {
    Router::new().route("/stock/{id}/reserve", post(reserve_handler))
}

/// Sends `POST /stock/7/reserve` through the router with `rt` as the current runtime; status,
/// `Retry-After` and body.
async fn post_reserve(rt: &Runtime) -> (StatusCode, Option<u64>, serde_json::Value) {
    let request = Request::post("/stock/7/reserve")
        .body(Body::empty())
        .expect("request");
    let response = rt.scope(app().oneshot(request)).await.expect("infallible");
    let status = response.status();
    let retry_after = response.headers().get(header::RETRY_AFTER).map(|v| {
        v.to_str()
            .expect("ascii")
            .parse::<u64>()
            .expect("whole seconds")
    });
    let bytes = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .expect("body");
    let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, retry_after, body)
}

/// Another runtime holds `stock:7` with 20 s left on its lease (hard cap): the handler answers
/// 409 with a `Retry-After` of the holder's remaining lease on the server (PTTL, rounded up to
/// whole seconds) and the JSON body naming the key; once the holder releases, 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_makes_the_handler_answer_409_with_the_holders_remaining_lease() {
    let (server, rt) = redis_with_runtime().await;
    let holder_rt = Runtime::from_url(&server.url())
        .await
        .expect("holder runtime");
    let holder = holder_rt
        .hold_capped("stock:7", Duration::from_secs(20))
        .await;
    tokio::time::sleep(Duration::from_millis(3300)).await;

    let (status, retry_after, body) = post_reserve(&rt).await;
    let mut conn = server.conn().await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(lock_key("stock:7"))
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let retry_after = retry_after.expect("a Retry-After header");
    // The server's TTL now, a moment after the answer: at most the answer's, and no more than
    // a second below it once rounded up.
    let server_secs = u64::try_from(pttl).expect("a TTL").div_ceil(1000);
    println!("Retry-After {retry_after}, server PTTL {pttl} ms");
    assert!(
        (16..=17).contains(&retry_after),
        "Retry-After {retry_after} for a 20 s lease taken 3.3 s ago"
    );
    assert!(
        server_secs <= retry_after && retry_after <= server_secs + 1,
        "Retry-After {retry_after} against the server's PTTL of {pttl} ms"
    );
    assert_eq!(body["key"], "stock:7");
    let message = body["error"].as_str().expect("a message");
    assert!(
        message.starts_with("lock `stock:7` not acquired within"),
        "{message}"
    );

    holder.release().await.expect("the holder's release");
    let (status, retry_after, _) = post_reserve(&rt).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(retry_after, None);
}
