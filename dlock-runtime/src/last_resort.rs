//! The release path that does not depend on the runtime's tokio handle.
//!
//! Releases scheduled from `Drop` (a guard dropped, an acquire cancelled) run as tasks on the
//! tokio runtime the lock runtime was built on. When that tokio runtime shuts down (`main`
//! returns while a task holds a guard, or a guard is dropped after it shut down) such a task
//! is dropped before it finishes. Instead of leaving the key locked until its lease ends, the
//! release then runs here: on a thread of its own, with a tokio runtime of its own and a new
//! connection to the engine (the old one was driven by the runtime that is gone), bounded by
//! the runtime's `timeout`. The dropping thread waits for it, so a process that exits right
//! after its tokio runtime does has sent the release first.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use crate::backend::{Context, DynBackend, EngineConfig, Wakeups};
use crate::core::Core;
use tokio::time::Instant;

/// How to reach the engine again, without the runtime's tokio handle.
pub(crate) struct LastResort {
    /// The engine's configuration, to connect again; `None` for an in-process engine, whose
    /// backend does not depend on any tokio runtime.
    config: Option<Box<dyn EngineConfig>>,
    prefix: String,
    timeout: Duration,
    /// Set after the engine could not be reached this way: later releases do not wait again.
    unreachable: AtomicBool,
}

impl LastResort {
    pub(crate) fn new(config: &dyn EngineConfig, prefix: String, timeout: Duration) -> Self {
        Self {
            config: (!config.in_process()).then(|| config.clone_box()),
            prefix,
            timeout,
            unreachable: AtomicBool::new(false),
        }
    }
}

/// Notifications have nowhere to go on a connection made only to release.
struct NoWakeups;

impl Wakeups for NoWakeups {
    fn wake(&self, _key: &str) {}
    fn wake_all(&self) {}
}

/// Releases `owner`'s hold on `key` without the runtime's tokio handle, waiting at most about
/// twice the runtime's `timeout` (connect, then release).
/// A hold that keeps its key until `hold_until` keeps it for what is left then.
pub(crate) fn release(core: &Arc<Core>, key: &str, owner: &str, hold_until: Option<Instant>) {
    let last = &core.last_resort;
    if last.unreachable.load(Ordering::Acquire) {
        tracing::warn!(key = %key, "lock not released at shutdown (engine unreachable); it expires with its lease");
        return;
    }
    let (done, finished) = mpsc::channel();
    let (core2, key2, owner2) = (core.clone(), key.to_owned(), owner.to_owned());
    let spawned = std::thread::Builder::new()
        .name("dlock-last-release".into())
        .spawn(move || {
            let released = release_on_own_runtime(&core2, &key2, &owner2, hold_until);
            let _ = done.send(released);
        });
    if spawned.is_err() {
        tracing::warn!(key = %key, "no thread for the release at shutdown; the lock expires with its lease");
        return;
    }
    let bound = last.timeout * 2 + Duration::from_millis(500);
    match finished.recv_timeout(bound) {
        Ok(Ok(())) => {
            tracing::debug!(key = %key, "lock released after its tokio runtime shut down")
        }
        Ok(Err(err)) => {
            last.unreachable.store(true, Ordering::Release);
            tracing::warn!(key = %key, error = %err, "release at shutdown failed; the lock expires with its lease");
        }
        Err(_) => {
            last.unreachable.store(true, Ordering::Release);
            tracing::warn!(key = %key, "release at shutdown timed out; the lock expires with its lease");
        }
    }
}

fn release_on_own_runtime(
    core: &Arc<Core>,
    key: &str,
    owner: &str,
    hold_until: Option<Instant>,
) -> Result<(), String> {
    let last = &core.last_resort;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("no tokio runtime: {e}"))?;
    runtime.block_on(async {
        let backend: Arc<dyn DynBackend> = match &last.config {
            None => core.backend.clone(),
            Some(config) => {
                let ctx = Context {
                    prefix: last.prefix.clone(),
                    origin: format!("{:016x}", core.id),
                    timeout: last.timeout,
                    wakeups: Arc::new(NoWakeups),
                };
                tokio::time::timeout(last.timeout, config.clone_box().connect(ctx))
                    .await
                    .map_err(|_| "connecting timed out".to_owned())?
                    .map_err(|e| e.to_string())?
            }
        };
        let ending = crate::core::end_in_engine(backend.as_ref(), key, owner, hold_until);
        tokio::time::timeout(last.timeout, ending)
            .await
            .map_err(|_| "the release timed out".to_owned())?
            .map(drop)
            .map_err(|e| e.to_string())
    })
}
