use std::time::Duration;

use super::*;
use crate::backend::{Attempt, Backend};
use crate::runtime::Runtime;

/// A compensating release that reaches the engine before the acquire it undoes (which then
/// lands): the key is freed within a few `timeout`s, not held for the 30 s lease.
#[tokio::test(start_paused = true)]
async fn an_acquire_landing_after_its_compensation_is_undone() {
    let rt = Runtime::builder()
        .memory()
        .timeout(Duration::from_secs(1))
        .build()
        .await
        .expect("memory runtime");
    let core = rt.core.clone();
    drop(ReleaseOnDrop::compensate(&core.releaser, "k", "late"));
    // The compensation runs first and finds nothing; then the request lands.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let landed = core
        .backend
        .try_acquire("k", "late", Duration::from_secs(30))
        .await
        .expect("acquire");
    assert!(matches!(landed, Attempt::Acquired { .. }), "{landed:?}");
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let locked = core.backend.is_locked("k").await.expect("is_locked");
    assert!(
        !locked,
        "the late acquire kept the key past its compensation"
    );
}
