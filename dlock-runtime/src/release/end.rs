//! The one way a hold ends in the engine, shared by the guard's release, the background
//! releases and the last resort.

use tokio::time::Instant;

use crate::backend::{AnyBackend, Backend, Released};
use crate::error::LockError;
use crate::lease::hold_left;

/// Ends `owner`'s hold on `key` in the engine: a release, or, while a `hold_at_least` that
/// keeps the key until `hold_until` lasts, [`release_after`](crate::backend::Backend::release_after)
/// with what remains of it.
pub(crate) async fn end_in_engine(
    backend: &AnyBackend,
    key: &str,
    owner: &str,
    hold_until: Option<Instant>,
) -> Result<Released, LockError> {
    match hold_left(hold_until) {
        Some(left) => backend.release_after(key, owner, left).await,
        None => backend.release(key, owner).await,
    }
}
