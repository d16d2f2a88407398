//! Checks shared by the behaviours, all through the public API.

use std::time::Duration;

pub(crate) use dlock_tests::{LONG_LEASE, SetOnDrop, acquire_within, assert_busy, assert_free};
use dlock_tests::{Runtime, eventually};

/// Bound on a release scheduled from `Drop` (panic, cancellation) reaching the engine:
/// generous for a loaded box, far below [`LONG_LEASE`].
pub(crate) const RELEASE_WITHIN: Duration = Duration::from_millis(1500);

/// Waits until the engine keeps no record of `key` at all (`is_locked` is false: no holder, and
/// on etcd and ZooKeeper no queued contender either); panics after [`RELEASE_WITHIN`].
pub(crate) async fn assert_nothing_left(rt: &Runtime, key: &str, when: &str) {
    let what = format!("{when}: the engine keeps no record of {key:?}");
    eventually(RELEASE_WITHIN, &what, || async {
        !rt.is_locked(key).await.expect("is_locked")
    })
    .await;
}
